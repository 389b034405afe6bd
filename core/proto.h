/* Internal: the control-plane messages and their payloads.
 *
 * Control connections (TCP, every participant to the coordinator, heartbeats both ways):
 *   HELLO       participant → coordinator   who I am (wsync_hello_t)
 *   WELCOME     coordinator → participant   accepted
 *   DESCRIBE    participant → coordinator   my shards or targets (reshard/plan.h codecs)
 *   PLAN        coordinator → all           scheme, explanation, peers, compiled plan
 *   PUSH_BEGIN  sender → coordinator        u64 version
 *   BEGIN       coordinator → receivers     u64 version (every sender began it)
 *   COMMIT      receiver → coordinator      u64 version
 *   DONE        coordinator → senders       u64 version (every receiver committed it)
 *   ERROR       participant → coordinator   i32 status, str text: a local failure; aborts group
 *   ABORT       coordinator → all           i32 status, str text: the group is over
 *   PEER_LOST   coordinator → all           i32 status, str text: who was lost and how
 *   BYE         participant → peer          leaving on purpose; the closing is not a loss
 *   HEARTBEAT   both ways                   empty
 * Versioned store (scheme `store`: senders publish, receivers read when they like):
 *   PUBLISH     sender → coordinator        u64 version, then the sender's directory entry
 *                                           (wsync_dir_entry_t): where its shards of it lie
 *   PUBLISHED   coordinator → sender        u64 version: every sender published it
 *   FREE        coordinator → sender        u64 version: evicted, nobody reads it, release it
 *   FETCH       receiver → coordinator      u64 version (0: the newest after `after`), u64 after,
 *                                           u64 seq (echoed in the reply)
 *   CANCEL      receiver → coordinator      u64 version: a FETCH given up on
 *   DIRECTORY   coordinator → receiver      u64 seq, i32 status, str text, then if OK: u64
 *                                           version, u32 n, n entries:
 *                                           the reader holds a lease on it until READ_DONE
 *   READ_DONE   receiver → coordinator      u64 version: lease released
 * Scheme side data through the coordinator (any scheme, once the PLAN is out; wsync_relay_t):
 *   SCHEME_SETUP participant → coordinator  u32 to_role, i32 to_rank, u32 tag, u32 len, len
 *                                           bytes: deliver these bytes to that member, or with
 *                                           to_role NONE (to_rank -1) to every other member
 *                                           (e.g. nccl: the communicator's unique id, checksums)
 *   SCHEME_RELAY coordinator → participant  u32 from_role, i32 from_rank, u32 tag, u32 len, len
 *                                           bytes: a SCHEME_SETUP forwarded, naming its author
 *                                           (the coordinator's word, not the author's, on who)
 * Data connections (scheme-specific, e.g. ipc over an abstract Unix socket):
 *   DATA_HELLO  receiver → sender           u32 receiver rank, u32 pid
 *   DATA_FDS    sender → receiver           scheme-defined payload; file descriptors attached
 *   READY       sender → receiver           u64 version, u32 bucket, u32 slot
 *   RELEASE     receiver → sender           u64 version, u32 bucket
 *   DELTA_START receiver → sender           u64 version, u64 holds (the version its targets
 *                                           hold intact, 0: none), u32 n, n × u32 plan chunk:
 *                                           the sender's chunks it takes plain even when it holds
 *                                           the base (casts, FP8 targets); delta mode only
 * In a delta-mode version READY also carries, after the slot: u64 base version, u32 delta slot,
 * u32 n (0: every chunk plain, else the bucket's chunk count), n × (u64 encoded length, 0 =
 * plain; u64 tree hash of the new values); the checksums (verification) follow as before.
 */
#ifndef WSYNC_CORE_PROTO_H
#define WSYNC_CORE_PROTO_H

#include <stdint.h>

#include "core/wire.h"
#include "reshard/plan.h"
#include "wsync/wsync.h"

enum {
    WSYNC_MSG_HELLO = 1,
    WSYNC_MSG_WELCOME,
    WSYNC_MSG_DESCRIBE,
    WSYNC_MSG_PLAN,
    WSYNC_MSG_PUSH_BEGIN,
    WSYNC_MSG_BEGIN,
    WSYNC_MSG_COMMIT,
    WSYNC_MSG_DONE,
    WSYNC_MSG_ERROR,
    WSYNC_MSG_ABORT,
    WSYNC_MSG_PEER_LOST,
    WSYNC_MSG_BYE,
    WSYNC_MSG_HEARTBEAT,
    WSYNC_MSG_DATA_HELLO,
    WSYNC_MSG_DATA_FDS,
    WSYNC_MSG_READY,
    WSYNC_MSG_RELEASE,
    WSYNC_MSG_PUBLISH,
    WSYNC_MSG_PUBLISHED,
    WSYNC_MSG_FREE,
    WSYNC_MSG_FETCH,
    WSYNC_MSG_CANCEL,
    WSYNC_MSG_DIRECTORY,
    WSYNC_MSG_READ_DONE,
    WSYNC_MSG_SCHEME_SETUP,
    WSYNC_MSG_SCHEME_RELAY,
    WSYNC_MSG_DELTA_START,
    WSYNC_MSG_COUNT_
};

const char *wsync_msg_name(unsigned type);

typedef enum { WSYNC_ROLE_NONE = 0, WSYNC_ROLE_SENDER = 1, WSYNC_ROLE_RECEIVER = 2 } wsync_role_t;

#define WSYNC_STR_MAX 4096            /* longest string field accepted from the wire */

/* Delta versions (issue 17, docs/delta.md): a participant's choice in HELLO, and the group's
 * resolved mode in PLAN (OFF or ON only). */
enum { WSYNC_DELTA_MODE_OFF = 0, WSYNC_DELTA_MODE_ON = 1, WSYNC_DELTA_MODE_AUTO = 2 };
/* "off" / "on" / "auto" -> the mode, -1 for anything else; and back. */
int wsync_delta_mode_parse(const char *s);
const char *wsync_delta_mode_name(uint32_t mode);

typedef struct {
    uint32_t role;                    /* wsync_role_t */
    int32_t rank;
    int32_t nsenders, nreceivers;
    uint32_t pid;
    uint64_t bucket_bytes;            /* senders: their bucket size */
    uint32_t transports;              /* bit i: registry transport i available here */
    char *hostname;
    char *host_id;                    /* core/util.h wsync_host_id() */
    char *data_addr;                  /* senders: abstract Unix socket for same-node data */
    char *scheme;                     /* senders: the user's choice ("auto", "ipc", ...) */
    uint32_t keep_versions;           /* sender 0: store versions kept */
    uint32_t delta;                   /* WSYNC_DELTA_MODE_*: this participant's choice */
} wsync_hello_t;

void wsync_hello_encode(const wsync_hello_t *h, wsync_wbuf_t *out);
wsync_status_t wsync_hello_decode(const void *p, size_t n, wsync_hello_t *h);
void wsync_hello_clear(wsync_hello_t *h);

/* The peers table in PLAN: what each participant must know of the others. */
typedef struct {
    uint32_t role;
    int32_t rank;
    uint32_t pid;
    char *host_id;
    char *data_addr;
} wsync_peer_t;

typedef struct {
    char *scheme;
    char *explain;
    uint32_t npeers;
    wsync_peer_t *peers;              /* senders in rank order, then receivers */
    const uint8_t *plan;              /* points into the decoded payload */
    uint32_t plan_len;
    uint32_t delta;                   /* the group's delta mode: WSYNC_DELTA_MODE_OFF or _ON (the
                                         reason is a line of `explain`) */
} wsync_plan_msg_t;

void wsync_plan_msg_encode(const wsync_plan_msg_t *m, wsync_wbuf_t *out);
/* The decoded message borrows `plan` from p: keep the payload alive while using it. */
wsync_status_t wsync_plan_msg_decode(const void *p, size_t n, wsync_plan_msg_t *m);
void wsync_plan_msg_clear(wsync_plan_msg_t *m);

/* One sender's part of a published version in the store: its RMA context address, the regions
 * it registered (packed remote keys), where each of its shards lies in them, and (delta mode)
 * where the version's encoded chunks are. Wire form: the fields in order; the delta part is u64
 * delta_base, then only when it is not 0: u32 region, u64 table, u32 n. */
typedef struct {
    uint32_t sender;
    char *transport;                  /* "ucx" or "ofi" */
    uint32_t addr_len;
    uint8_t *addr;                    /* RMA context address */
    uint32_t nregions;
    struct wsync_dir_region {
        uint64_t base, len;           /* in the sender's address space */
        uint32_t rkey_len;
        uint8_t *rkey;
    } *regions;
    uint32_t nshards;
    struct wsync_dir_shard {
        uint32_t region;
        uint64_t addr;                /* the shard's first byte */
    } *shards;
    /* Delta versions (schemes/store_delta.c): the base version this version's regions were
     * encoded against, 0 = none (every reader reads full bytes; the fields below are then 0 and
     * not on the wire). Else a table of delta_n rows at delta_table, in region delta_region, one
     * per shard region some reader asked for, sorted by (shard, off, rows, cols, pitch): u32
     * shard, u32 the stream's format (core/delta.h: 3, or 4 where only readers of host targets
     * asked for the region; 0 with no stream), u64 off, rows, cols, pitch (elements), u64
     * offset of its encoded stream
     * from the table's first byte, u64 its length (0: read it plain), u64 the xxh3 tree hash of
     * its new values (core/delta.h); little-endian. */
    uint64_t delta_base;
    uint32_t delta_region;
    uint64_t delta_table;
    uint32_t delta_n;
} wsync_dir_entry_t;

#define WSYNC_DIR_DELTA_ROW 64u       /* bytes of one row of a delta table */

void wsync_dir_entry_encode(const wsync_dir_entry_t *e, wsync_wbuf_t *out);
/* Strict: sizes bounded, shard addresses inside their region, a delta table inside its
 * region. */
wsync_status_t wsync_dir_entry_decode(wsync_rbuf_t *in, wsync_dir_entry_t *e);
/* Where chunk c of version v lies in its sender's directory entry en: the registered region
 * holding its rows (*rg) and its first byte in the sender's address space (*first). A chunk of
 * no rows, a shard the entry lacks or rows outside the region is PROTOCOL naming the sender,
 * shard and bytes: a wrong address never reaches the wire. */
wsync_status_t wsync_dir_chunk_span(const wsync_dir_entry_t *en, const wsync_chunk_t *c,
                                    uint64_t v, const struct wsync_dir_region **rg,
                                    uint64_t *first);
void wsync_dir_entry_clear(wsync_dir_entry_t *e);

/* SCHEME_SETUP and SCHEME_RELAY: bytes a scheme sends to one member or to all the others through
 * the coordinator. In SCHEME_SETUP (role, rank) is the destination, role WSYNC_ROLE_NONE with
 * rank -1 meaning every member but the author; in SCHEME_RELAY it is the author, never NONE. */
#define WSYNC_RELAY_MAX (16u << 20)   /* bytes of one relay's data */
typedef struct {
    uint32_t role;                    /* wsync_role_t */
    int32_t rank;
    uint32_t tag;                     /* the scheme's: what the bytes are */
    uint32_t len;
    const uint8_t *data;              /* [len]; decoded: points into the payload */
} wsync_relay_t;

void wsync_relay_encode(const wsync_relay_t *m, wsync_wbuf_t *out);
/* Strict, for type WSYNC_MSG_SCHEME_SETUP or WSYNC_MSG_SCHEME_RELAY: a known role (NONE only in
 * SETUP, and then rank -1), rank >= 0 otherwise, len <= WSYNC_RELAY_MAX and exactly the bytes
 * left. WSYNC_ERR_PROTOCOL otherwise; *m borrows from p and is written only on success. */
wsync_status_t wsync_relay_decode(const void *p, size_t n, unsigned type, wsync_relay_t *m);

/* Status + text payload of ERROR, ABORT and PEER_LOST. */
void wsync_status_msg_encode(wsync_status_t st, const char *text, wsync_wbuf_t *out);
wsync_status_t wsync_status_msg_decode(const void *p, size_t n, wsync_status_t *st, char *text,
                                       size_t text_len);

#endif
