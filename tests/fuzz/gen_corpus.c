/* Writes the fuzzers' seed corpora (tests/fuzz/corpus/<name>/) from the library's own encoders:
 *
 *   fuzz_gen_corpus DIR        (run from the build tree: build/tests/fuzz_gen_corpus
 *                               tests/fuzz/corpus)
 *
 * Seeds are real traffic of two groups: the tiny Qwen3 of ../shared/testdata (FSDP-2 to TP-2,
 * bf16, and with block FP8 targets), and a micro model of the same family small enough for the
 * plan fuzzer to compile and run (its mode 4). Output is deterministic: the same library writes
 * the same bytes, so regenerated seeds show up in a diff only when a wire format changed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/delta.h"
#include "core/frame.h"
#include "core/proto.h"
#include "core/wire.h"
#include "reshard/plan.h"
#include "wsync/wsync.h"

#ifndef WSYNC_TESTDATA
#define WSYNC_TESTDATA "../shared/testdata"
#endif

static const char *outdir;
static int nwritten;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_gen_corpus: %s: %s\n", what, wsync_last_error());
    exit(1);
}

static void write_seed(const char *target, const char *name, const void *p, size_t n)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", outdir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", outdir, target, name);
    f = fopen(path, "wb");
    if (f == NULL || (n > 0 && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    nwritten++;
}

static void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    long n;
    void *p;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
        perror(path);
        exit(1);
    }
    p = malloc((size_t)n + 1);
    if (p == NULL || fread(p, 1, (size_t)n, f) != (size_t)n) {
        perror(path);
        exit(1);
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* ---- a group: descriptions and the plan the coordinator would compile ------------------------ */

typedef struct {
    wsync_model_config_t cfg;
    uint32_t nsenders, nreceivers;
    wsync_shard_desc_t *shards;
    size_t nshards;
    wsync_target_desc_t *targets;
    size_t ntargets;
    wsync_plan_t *plan;
} group_t;

static char dummy_data[1];   /* descriptions need a non-NULL pointer, never read */

/* fp8: 0 bf16 targets, 1 FP8 32 x 32 blocks, 2 the same with FP8 on the wire */
static void group_make(group_t *g, const wsync_model_config_t *cfg, uint32_t nsenders,
                       uint32_t nreceivers, int fp8, uint64_t bucket)
{
    memset(g, 0, sizeof(*g));
    g->cfg = *cfg;
    g->nsenders = nsenders;
    g->nreceivers = nreceivers;
    for (uint32_t s = 0; s < nsenders; s++) {
        wsync_shard_t *sh;
        size_t n;
        if (wsync_layout_fsdp_shards(cfg, (wsync_dtype_t)0, (int)s, (int)nsenders, &sh, &n))
            die("fsdp shards");
        g->shards = realloc(g->shards, (g->nshards + n) * sizeof(*g->shards));
        for (size_t i = 0; i < n; i++) {
            sh[i].data = dummy_data;
            if (wsync_shard_desc_from(&sh[i], s, (uint32_t)i, &g->shards[g->nshards++]))
                die("shard description");
        }
        wsync_layout_shards_free(sh, n);
    }
    for (uint32_t r = 0; r < nreceivers; r++) {
        wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;
        wsync_target_t *t;
        size_t n;
        if (fp8) {   /* 32 x 32 blocks: the tiny model's TP-2 slices are 64 rows */
            opt.quant.scheme = WSYNC_QUANT_BLOCK;
            opt.quant.block_rows = opt.quant.block_cols = 32;
        }
        if (wsync_layout_tp_targets(cfg, (int)r, (int)nreceivers, &opt, &t, &n))
            die("tp targets");
        g->targets = realloc(g->targets, (g->ntargets + n) * sizeof(*g->targets));
        for (size_t i = 0; i < n; i++) {
            t[i].data = dummy_data;
            if (wsync_target_desc_from(&t[i], r, (uint32_t)i, &g->targets[g->ntargets++]))
                die("target description");
        }
        wsync_layout_targets_free(t, n);
    }
    /* fp8 2: FP8 on the wire, as the coordinator compiles for ipc and nccl */
    const wsync_plan_opts_t opts = {fp8 == 2, 0};
    if (wsync_plan_compile_opts(g->shards, g->nshards, g->targets, g->ntargets, nsenders,
                                nreceivers, bucket, &opts, &g->plan))
        die("plan compile");
}

static void group_free(group_t *g)
{
    for (size_t i = 0; i < g->nshards; i++)
        wsync_shard_desc_clear(&g->shards[i]);
    for (size_t i = 0; i < g->ntargets; i++)
        wsync_target_desc_clear(&g->targets[i]);
    free(g->shards);
    free(g->targets);
    wsync_plan_free(g->plan);
}

/* The descriptions of one rank (sender >= 0) or of one receiver (receiver >= 0), encoded. */
static void encode_shards_of(const group_t *g, int sender, wsync_wbuf_t *b)
{
    wsync_shard_desc_t *v = malloc((g->nshards + 1) * sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < g->nshards; i++)
        if (sender < 0 || g->shards[i].sender == (uint32_t)sender)
            v[n++] = g->shards[i];
    wsync_shards_encode(v, n, b);
    free(v);
}

static void encode_targets_of(const group_t *g, int receiver, wsync_wbuf_t *b)
{
    wsync_target_desc_t *v = malloc((g->ntargets + 1) * sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < g->ntargets; i++)
        if (receiver < 0 || g->targets[i].receiver == (uint32_t)receiver)
            v[n++] = g->targets[i];
    wsync_targets_encode(v, n, b);
    free(v);
}

/* ---- frames ------------------------------------------------------------------------------------ */

static void put_frame(wsync_wbuf_t *stream, uint16_t type, const wsync_wbuf_t *payload)
{
    uint8_t hdr[WSYNC_FRAME_HDR];
    const void *p = payload ? payload->data : NULL;
    uint32_t n = payload ? (uint32_t)payload->len : 0;

    wsync_frame_hdr_encode(type, 0, p ? p : "", n, hdr);
    wsync_put_bytes(stream, hdr, sizeof(hdr));
    wsync_put_bytes(stream, p, n);
}

static void u64_payload(wsync_wbuf_t *b, uint64_t v)
{
    wsync_wbuf_init(b);
    wsync_put_u64(b, v);
}

/* One message in the in-thread mode (fuzz_frame.c: mode 0, flags 0). */
static void frame_seed(const char *name, uint8_t mode, uint16_t type, const wsync_wbuf_t *payload)
{
    wsync_wbuf_t s;

    wsync_wbuf_init(&s);
    wsync_put_u8(&s, mode);
    wsync_put_u8(&s, 0);
    put_frame(&s, type, payload);
    write_seed("frame", name, s.data, s.len);
    wsync_wbuf_free(&s);
}

static void hello_payload(wsync_wbuf_t *b, uint32_t role, int rank, int nsenders, int nreceivers)
{
    wsync_hello_t h;

    memset(&h, 0, sizeof(h));
    h.role = role;
    h.rank = rank;
    h.nsenders = nsenders;
    h.nreceivers = nreceivers;
    h.pid = 4242 + (uint32_t)rank;
    h.bucket_bytes = role == WSYNC_ROLE_SENDER ? 256u << 20 : 0;
    h.transports = 0x3;
    h.hostname = "trainer-0";
    h.host_id = "3f2a9c0e5b7d4e11";
    h.data_addr = role == WSYNC_ROLE_SENDER ? "@wsync-4242-0" : NULL;
    h.scheme = role == WSYNC_ROLE_SENDER ? "auto" : NULL;
    h.keep_versions = role == WSYNC_ROLE_SENDER && rank == 0 ? 2 : 0;
    wsync_wbuf_init(b);
    wsync_hello_encode(&h, b);
}

static void plan_msg_payload(wsync_wbuf_t *b, const group_t *g, const char *scheme)
{
    wsync_wbuf_t pb;
    wsync_plan_msg_t m;
    wsync_peer_t peers[16];
    char addrs[16][32];

    wsync_wbuf_init(&pb);
    wsync_plan_encode(g->plan, &pb);
    memset(&m, 0, sizeof(m));
    m.scheme = (char *)scheme;
    m.explain = "ipc: every receiver shares a node with its senders";
    m.npeers = g->nsenders + g->nreceivers;
    for (uint32_t i = 0; i < m.npeers && i < 16; i++) {
        int sender = i < g->nsenders;
        peers[i].role = sender ? WSYNC_ROLE_SENDER : WSYNC_ROLE_RECEIVER;
        peers[i].rank = (int32_t)(sender ? i : i - g->nsenders);
        peers[i].pid = 4242 + i;
        peers[i].host_id = "3f2a9c0e5b7d4e11";
        snprintf(addrs[i], sizeof(addrs[i]), "@wsync-%u-%d", 4242 + i, peers[i].rank);
        peers[i].data_addr = sender ? addrs[i] : NULL;
    }
    m.peers = peers;
    m.plan = pb.data;
    m.plan_len = (uint32_t)pb.len;
    wsync_wbuf_init(b);
    wsync_plan_msg_encode(&m, b);
    wsync_wbuf_free(&pb);
}

static void dir_entry(wsync_wbuf_t *b, uint32_t sender, uint32_t nshards)
{
    wsync_dir_entry_t e;
    uint8_t addr[48], rkey[2][24];
    struct wsync_dir_region regions[2];
    struct wsync_dir_shard *shards = calloc(nshards + 1, sizeof(*shards));

    for (size_t i = 0; i < sizeof(addr); i++)
        addr[i] = (uint8_t)(i * 7 + sender);
    for (int g = 0; g < 2; g++) {
        for (size_t i = 0; i < sizeof(rkey[g]); i++)
            rkey[g][i] = (uint8_t)(i * 13 + g);
        regions[g].base = 0x7f0000000000ull + (uint64_t)g * (1ull << 30);
        regions[g].len = 1u << 20;
        regions[g].rkey_len = sizeof(rkey[g]);
        regions[g].rkey = rkey[g];
    }
    for (uint32_t i = 0; i < nshards; i++) {
        shards[i].region = i % 2;
        shards[i].addr = regions[i % 2].base + (uint64_t)i * 4096;
    }
    memset(&e, 0, sizeof(e));
    e.sender = sender;
    e.transport = "ucx";
    e.addr_len = sizeof(addr);
    e.addr = addr;
    e.nregions = 2;
    e.regions = regions;
    e.nshards = nshards;
    e.shards = shards;
    wsync_dir_entry_encode(&e, b);
    free(shards);
}

/* What one client of a coordinator sends: HELLO, DESCRIBE, then per version PUSH_BEGIN (a
 * sender) or COMMIT (a receiver); with the store, PUBLISH and FETCH / READ_DONE instead. */
static void client_stream(wsync_wbuf_t *out, const group_t *g, uint32_t role, int store)
{
    wsync_wbuf_t b;
    int sender = role == WSYNC_ROLE_SENDER;
    wsync_hello_t h;

    memset(&h, 0, sizeof(h));
    h.role = role;
    h.rank = 0;
    h.nsenders = (int32_t)g->nsenders;
    h.nreceivers = (int32_t)g->nreceivers;
    h.pid = sender ? 100 : 200;
    h.bucket_bytes = sender ? 4096 : 0;
    h.transports = 0xffffffffu;
    h.hostname = "vm";
    h.host_id = "3f2a9c0e5b7d4e11";
    h.data_addr = sender ? "@wsync-100-0" : NULL;
    h.scheme = sender ? (store ? "store" : "ipc") : NULL;
    h.keep_versions = sender ? 2 : 0;
    wsync_wbuf_init(&b);
    wsync_hello_encode(&h, &b);
    put_frame(out, WSYNC_MSG_HELLO, &b);
    wsync_wbuf_free(&b);
    wsync_wbuf_init(&b);
    if (sender)
        encode_shards_of(g, 0, &b);
    else
        encode_targets_of(g, 0, &b);
    put_frame(out, WSYNC_MSG_DESCRIBE, &b);
    wsync_wbuf_free(&b);
    for (uint64_t v = 1; v <= 2; v++) {
        wsync_wbuf_init(&b);
        wsync_put_u64(&b, v);
        if (store && sender) {
            size_t n = 0;
            for (size_t i = 0; i < g->nshards; i++)
                n += g->shards[i].sender == 0;
            dir_entry(&b, 0, (uint32_t)n);
            put_frame(out, WSYNC_MSG_PUBLISH, &b);
        } else if (store) {
            wsync_put_u64(&b, v - 1);
            wsync_put_u64(&b, v);                  /* seq */
            put_frame(out, WSYNC_MSG_FETCH, &b);
            wsync_wbuf_free(&b);
            u64_payload(&b, v);
            put_frame(out, WSYNC_MSG_READ_DONE, &b);
        } else {
            put_frame(out, sender ? WSYNC_MSG_PUSH_BEGIN : WSYNC_MSG_COMMIT, &b);
        }
        wsync_wbuf_free(&b);
    }
    put_frame(out, WSYNC_MSG_HEARTBEAT, NULL);
    put_frame(out, WSYNC_MSG_BYE, NULL);
}

/* Coordinator modes: 2 = two clients, the u16 split first; 3 = one client. */
static void coordinator_seeds(const group_t *g)
{
    for (int store = 0; store < 2; store++) {
        wsync_wbuf_t a, b, s;
        char name[48];
        wsync_wbuf_init(&a);
        wsync_wbuf_init(&b);
        client_stream(&a, g, WSYNC_ROLE_SENDER, store);
        client_stream(&b, g, WSYNC_ROLE_RECEIVER, store);
        for (int fix = 0; fix < 2; fix++) {
            wsync_wbuf_init(&s);
            wsync_put_u8(&s, 2);
            wsync_put_u8(&s, (uint8_t)(fix ? 1 : 0));
            wsync_put_u16(&s, (uint16_t)a.len);
            wsync_put_bytes(&s, a.data, a.len);
            wsync_put_bytes(&s, b.data, b.len);
            snprintf(name, sizeof(name), "coordinator_%s%s", store ? "store" : "ipc",
                     fix ? "_fixed" : "");
            write_seed("frame", name, s.data, s.len);
            wsync_wbuf_free(&s);
        }
        wsync_wbuf_init(&s);
        wsync_put_u8(&s, 3);
        wsync_put_u8(&s, 0);
        wsync_put_bytes(&s, a.data, a.len);
        snprintf(name, sizeof(name), "coordinator_%s_sender_only", store ? "store" : "ipc");
        write_seed("frame", name, s.data, s.len);
        wsync_wbuf_free(&s);
        wsync_wbuf_free(&a);
        wsync_wbuf_free(&b);
    }
}

static void frame_seeds(const group_t *g)
{
    wsync_wbuf_t b, stream;
    /* loop mode's flags: checksums fixed or not, Unix with 0, 1 or 3 descriptors, heartbeats,
     * pieces */
    static const uint8_t loop_flags[] = {0x00, 0x05, 0x0d, 0x15, 0x07, 0x3d};

    hello_payload(&b, WSYNC_ROLE_SENDER, 0, 2, 2);
    frame_seed("hello_sender", 0, WSYNC_MSG_HELLO, &b);
    wsync_wbuf_free(&b);
    hello_payload(&b, WSYNC_ROLE_RECEIVER, 1, -1, 2);
    frame_seed("hello_receiver", 0, WSYNC_MSG_HELLO, &b);
    wsync_wbuf_free(&b);

    wsync_wbuf_init(&b);
    encode_shards_of(g, 0, &b);
    frame_seed("describe_shards", 0, WSYNC_MSG_DESCRIBE, &b);
    wsync_wbuf_free(&b);
    wsync_wbuf_init(&b);
    encode_targets_of(g, 1, &b);
    frame_seed("describe_targets", 0, WSYNC_MSG_DESCRIBE, &b);
    wsync_wbuf_free(&b);

    plan_msg_payload(&b, g, "ipc");
    frame_seed("plan", 0, WSYNC_MSG_PLAN, &b);
    wsync_wbuf_free(&b);

    wsync_wbuf_init(&b);
    wsync_status_msg_encode(WSYNC_ERR_PEER_LOST, "receiver 1 (pid 4245) sent nothing for 3000 ms",
                            &b);
    frame_seed("peer_lost", 0, WSYNC_MSG_PEER_LOST, &b);
    frame_seed("error", 0, WSYNC_MSG_ERROR, &b);
    wsync_wbuf_free(&b);
    wsync_wbuf_init(&b);
    wsync_status_msg_encode(WSYNC_ERR_MISMATCH, "param 'model.norm.weight': bf16 [128] vs f32", &b);
    frame_seed("abort", 0, WSYNC_MSG_ABORT, &b);
    wsync_wbuf_free(&b);

    {
        /* the nccl scheme's GPU description with sender 0's unique id, to everyone */
        static const uint8_t blob[16 + 4 + 4 + 4 + 4 + 128] = {0x4c, 0x43, 0x43, 0x4e, 1};
        wsync_relay_t rl = {WSYNC_ROLE_NONE, -1, 1, sizeof(blob), blob};
        wsync_wbuf_init(&b);
        wsync_relay_encode(&rl, &b);
        frame_seed("scheme_setup", 0, WSYNC_MSG_SCHEME_SETUP, &b);
        wsync_wbuf_free(&b);
        rl.role = WSYNC_ROLE_SENDER;
        rl.rank = 0;
        wsync_wbuf_init(&b);
        wsync_relay_encode(&rl, &b);
        frame_seed("scheme_relay", 0, WSYNC_MSG_SCHEME_RELAY, &b);
        wsync_wbuf_free(&b);
    }

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, 7);
    dir_entry(&b, 1, 5);
    frame_seed("publish", 0, WSYNC_MSG_PUBLISH, &b);
    wsync_wbuf_free(&b);

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, 3);                     /* seq */
    wsync_put_i32(&b, WSYNC_OK);
    wsync_put_str(&b, "");
    wsync_put_u64(&b, 7);                     /* version */
    wsync_put_u32(&b, 2);
    dir_entry(&b, 0, 3);
    dir_entry(&b, 1, 5);
    frame_seed("directory", 0, WSYNC_MSG_DIRECTORY, &b);
    wsync_wbuf_free(&b);
    wsync_wbuf_init(&b);
    wsync_put_u64(&b, 4);
    wsync_put_i32(&b, WSYNC_ERR_NOT_FOUND);
    wsync_put_str(&b, "version 9 was evicted");
    frame_seed("directory_error", 0, WSYNC_MSG_DIRECTORY, &b);
    wsync_wbuf_free(&b);

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, 0);
    wsync_put_u64(&b, 6);
    wsync_put_u64(&b, 3);
    frame_seed("fetch", 0, WSYNC_MSG_FETCH, &b);
    wsync_wbuf_free(&b);
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, 1);
    wsync_put_u32(&b, 4245);
    frame_seed("data_hello", 0, WSYNC_MSG_DATA_HELLO, &b);
    wsync_wbuf_free(&b);
    wsync_wbuf_init(&b);
    wsync_put_u64(&b, 7);
    wsync_put_u32(&b, 0);
    wsync_put_u32(&b, 1);
    frame_seed("ready", 0, WSYNC_MSG_READY, &b);
    wsync_wbuf_free(&b);
    wsync_wbuf_init(&b);
    wsync_put_u64(&b, 7);
    wsync_put_u32(&b, 0);
    frame_seed("release", 0, WSYNC_MSG_RELEASE, &b);
    wsync_wbuf_free(&b);
    u64_payload(&b, 7);
    frame_seed("commit", 0, WSYNC_MSG_COMMIT, &b);
    frame_seed("push_begin", 0, WSYNC_MSG_PUSH_BEGIN, &b);
    wsync_wbuf_free(&b);
    frame_seed("heartbeat", 0, WSYNC_MSG_HEARTBEAT, NULL);

    /* a whole receiver session, as the coordinator's connection would carry it */
    wsync_wbuf_init(&stream);
    hello_payload(&b, WSYNC_ROLE_RECEIVER, 1, -1, 2);
    put_frame(&stream, WSYNC_MSG_HELLO, &b);
    wsync_wbuf_free(&b);
    put_frame(&stream, WSYNC_MSG_HEARTBEAT, NULL);
    wsync_wbuf_init(&b);
    encode_targets_of(g, 1, &b);
    put_frame(&stream, WSYNC_MSG_DESCRIBE, &b);
    wsync_wbuf_free(&b);
    plan_msg_payload(&b, g, "ipc");
    put_frame(&stream, WSYNC_MSG_PLAN, &b);
    wsync_wbuf_free(&b);
    for (uint64_t v = 1; v <= 2; v++) {
        u64_payload(&b, v);
        put_frame(&stream, WSYNC_MSG_BEGIN, &b);
        put_frame(&stream, WSYNC_MSG_COMMIT, &b);
        wsync_wbuf_free(&b);
    }
    put_frame(&stream, WSYNC_MSG_BYE, NULL);
    {
        wsync_wbuf_t s;
        wsync_wbuf_init(&s);
        wsync_put_u8(&s, 0);
        wsync_put_u8(&s, 0);
        wsync_put_bytes(&s, stream.data, stream.len);
        write_seed("frame", "session", s.data, s.len);
        for (size_t i = 0; i < sizeof(loop_flags); i++) {
            char name[32];
            s.data[0] = 1;
            s.data[1] = loop_flags[i];
            snprintf(name, sizeof(name), "session_loop_%02x", loop_flags[i]);
            write_seed("frame", name, s.data, s.len);
        }
        wsync_wbuf_free(&s);
    }
    wsync_wbuf_free(&stream);
}

/* ---- plans and descriptions ------------------------------------------------------------------ */

static void plan_seeds(const group_t *g, const char *tag, int with_compile)
{
    wsync_wbuf_t b, pb;
    char name[64];

    wsync_wbuf_init(&pb);
    wsync_plan_encode(g->plan, &pb);

    wsync_wbuf_init(&b);
    wsync_put_u8(&b, 0);
    wsync_put_bytes(&b, pb.data, pb.len);
    snprintf(name, sizeof(name), "plan_%s", tag);
    write_seed("plan", name, b.data, b.len);
    wsync_wbuf_free(&b);

    wsync_wbuf_init(&b);
    wsync_put_u8(&b, 1);
    encode_shards_of(g, -1, &b);
    snprintf(name, sizeof(name), "shards_%s", tag);
    write_seed("plan", name, b.data, b.len);
    wsync_wbuf_free(&b);

    wsync_wbuf_init(&b);
    wsync_put_u8(&b, 2);
    encode_targets_of(g, -1, &b);
    snprintf(name, sizeof(name), "targets_%s", tag);
    write_seed("plan", name, b.data, b.len);
    wsync_wbuf_free(&b);

    wsync_wbuf_init(&b);
    wsync_put_u8(&b, 3);
    wsync_put_u32(&b, (uint32_t)pb.len);
    wsync_put_bytes(&b, pb.data, pb.len);
    encode_shards_of(g, -1, &b);
    encode_targets_of(g, -1, &b);
    snprintf(name, sizeof(name), "checked_%s", tag);
    write_seed("plan", name, b.data, b.len);
    wsync_wbuf_free(&b);

    if (with_compile) {
        wsync_wbuf_init(&b);
        wsync_put_u8(&b, 4);
        wsync_put_u8(&b, (uint8_t)(g->nsenders - 1));
        wsync_put_u8(&b, (uint8_t)(g->nreceivers - 1));
        wsync_put_u32(&b, (uint32_t)g->plan->bucket_bytes);
        encode_shards_of(g, -1, &b);
        encode_targets_of(g, -1, &b);
        snprintf(name, sizeof(name), "compile_%s", tag);
        write_seed("plan", name, b.data, b.len);
        wsync_wbuf_free(&b);
    }
    wsync_wbuf_free(&pb);
}

/* Hand-made descriptions for the compiler: replicas, a 3-D param, casts, a u8 table, a target
 * with two pieces side by side and one with an uncovered tail. */
static void compile_seed_misc(void)
{
    static char a[] = "w.a", b[] = "w.b", c[] = "w.c", d[] = "w.d";
    wsync_shard_desc_t sh[5];
    wsync_target_desc_t tg[4];
    wsync_piece_desc_t pa[2], pb[1], pc[1], pd[1];
    wsync_wbuf_t w;

    memset(sh, 0, sizeof(sh));
    memset(tg, 0, sizeof(tg));
    memset(pa, 0, sizeof(pa));
    memset(pb, 0, sizeof(pb));
    memset(pc, 0, sizeof(pc));
    memset(pd, 0, sizeof(pd));
    /* a: bf16 [8, 16], rows split over senders 0 and 1 */
    for (int s = 0; s < 2; s++) {
        sh[s].sender = (uint32_t)s;
        sh[s].index = 0;
        sh[s].param = (wsync_pdesc_t){a, WSYNC_DTYPE_BF16, 2, {8, 16}};
        sh[s].box.start[0] = 4 * s;
        sh[s].box.len[0] = 4;
        sh[s].box.len[1] = 16;
    }
    /* b: f32 [10], replicated on both senders */
    for (int s = 0; s < 2; s++) {
        sh[2 + s].sender = (uint32_t)s;
        sh[2 + s].index = 1;
        sh[2 + s].param = (wsync_pdesc_t){b, WSYNC_DTYPE_F32, 1, {10}};
        sh[2 + s].box.len[0] = 10;
    }
    /* c: u8 [2, 3, 5] on sender 1 */
    sh[4].sender = 1;
    sh[4].index = 2;
    sh[4].param = (wsync_pdesc_t){c, WSYNC_DTYPE_U8, 3, {2, 3, 5}};
    sh[4].box.len[0] = 2;
    sh[4].box.len[1] = 3;
    sh[4].box.len[2] = 5;
    (void)d;

    /* receiver 0: columns [0, 8) and [8, 16) of a, swapped, in one [8, 16] target */
    tg[0] = (wsync_target_desc_t){0, 0, (char *)"a.swapped", WSYNC_DTYPE_BF16, 2, {8, 16},
                                  WSYNC_MEM_HOST, 0, WSYNC_QUANT_NONE, 0, 0, 0.0f, 0, 0, 2, pa};
    for (int k = 0; k < 2; k++) {
        pa[k].param = sh[0].param;
        pa[k].src.len[0] = 8;
        pa[k].src.start[1] = 8 * k;
        pa[k].src.len[1] = 8;
        pa[k].dst_start[1] = 8 - 8 * k;
    }
    /* receiver 0: b cast to bf16 in a [12] target (2 elements uncovered) */
    tg[1] = (wsync_target_desc_t){0, 1, (char *)"b.padded", WSYNC_DTYPE_BF16, 1, {12},
                                  WSYNC_MEM_HOST, 0, WSYNC_QUANT_NONE, 0, 0, 0.0f, 0, 0, 1, pb};
    pb[0].param = sh[2].param;
    pb[0].src.len[0] = 10;
    /* receiver 1: rows [2, 6) of a */
    tg[2] = (wsync_target_desc_t){1, 0, (char *)"a.rows", WSYNC_DTYPE_BF16, 2, {4, 16},
                                  WSYNC_MEM_HOST, 0, WSYNC_QUANT_NONE, 0, 0, 0.0f, 0, 0, 1, pc};
    pc[0].param = sh[0].param;
    pc[0].src.start[0] = 2;
    pc[0].src.len[0] = 4;
    pc[0].src.len[1] = 16;
    /* receiver 1: a [1, 2, 5] slab of c */
    tg[3] = (wsync_target_desc_t){1, 1, (char *)"c.slab", WSYNC_DTYPE_U8, 3, {1, 2, 5},
                                  WSYNC_MEM_HOST, 0, WSYNC_QUANT_NONE, 0, 0, 0.0f, 0, 0, 1, pd};
    pd[0].param = sh[4].param;
    pd[0].src.start[0] = 1;
    pd[0].src.len[0] = 1;
    pd[0].src.start[1] = 1;
    pd[0].src.len[1] = 2;
    pd[0].src.len[2] = 5;

    wsync_wbuf_init(&w);
    wsync_put_u8(&w, 4);
    wsync_put_u8(&w, 1);
    wsync_put_u8(&w, 1);
    wsync_put_u32(&w, 128);
    wsync_shards_encode(sh, 5, &w);
    wsync_targets_encode(tg, 4, &w);
    write_seed("plan", "compile_misc", w.data, w.len);
    wsync_wbuf_free(&w);
}

/* ---- config.json ---------------------------------------------------------------------------- */

static const char micro_config[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 8,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"head_dim\": 4, \"intermediate_size\": 16, \"vocab_size\": 40,"
    " \"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-06, \"dtype\": \"bfloat16\","
    " \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}}";

static void config_seeds(void)
{
    static const struct {
        const char *name, *json;
    } seeds[] = {
        {"micro_qwen3", micro_config},
        {"llama_v4", "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
                     " \"hidden_size\": 64, \"intermediate_size\": 172, \"num_hidden_layers\": 2,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                     " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-05,"
                     " \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 8.0,"
                     " \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": true,"
                     " \"attention_bias\": false, \"mlp_bias\": true,"
                     " \"torch_dtype\": \"float32\", \"vocab_size\": 1000}"},
        {"qwen2_nulls", "{\"model_type\": \"qwen2\", \"hidden_size\": 48, \"intermediate_size\": 96,"
                        " \"num_hidden_layers\": 1, \"num_attention_heads\": 6,"
                        " \"num_key_value_heads\": null, \"head_dim\": null, \"vocab_size\": 77,"
                        " \"rope_theta\": 10000, \"sliding_window\": null,"
                        " \"torch_dtype\": \"float16\"}"},
        {"architectures_only", "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 32,"
                               " \"intermediate_size\": 64, \"num_hidden_layers\": 3,"
                               " \"num_attention_heads\": 4, \"num_key_value_heads\": 4,"
                               " \"vocab_size\": 128, \"tie_word_embeddings\": true}"},
        {"qwen3_big_sizes", "{\"model_type\": \"qwen3\", \"hidden_size\": 2147483647,"
                            " \"intermediate_size\": 2147483647, \"num_hidden_layers\": 1,"
                            " \"num_attention_heads\": 2147483647, \"num_key_value_heads\": 1,"
                            " \"head_dim\": 2147483647, \"vocab_size\": 2147483647}"},
    };
    size_t len;
    char *tiny = read_file(WSYNC_TESTDATA "/hf_qwen3_tiny/config.json", &len);

    write_seed("config", "hf_qwen3_tiny", tiny, len);
    free(tiny);
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
        write_seed("config", seeds[i].name, seeds[i].json, strlen(seeds[i].json));
}

/* ---- safetensors ---------------------------------------------------------------------------- */

static const char *st_dtype(wsync_dtype_t dt)
{
    switch (dt) {
    case WSYNC_DTYPE_BF16: return "BF16";
    case WSYNC_DTYPE_F16: return "F16";
    case WSYNC_DTYPE_F32: return "F32";
    case WSYNC_DTYPE_F8E4M3FN: return "F8_E4M3";
    case WSYNC_DTYPE_F8E5M2: return "F8_E5M2";
    default: return "U8";
    }
}

/* An image of the model's params (zeros), as save_pretrained lays one out; the fuzz input is the
 * image then a u32 of extra zero bytes (see fuzz_safetensors.c). header_only: the image stops
 * after the header and the u32 asks for the whole data area. */
static void st_seed(const char *name, const wsync_param_t *p, size_t n, int header_only,
                    const char *extra)
{
    wsync_wbuf_t h, img;
    uint64_t off = 0;
    char ent[512];

    wsync_wbuf_init(&h);
    wsync_put_bytes(&h, "{\"__metadata__\":{\"format\":\"pt\"}", 32);
    if (extra != NULL)
        wsync_put_bytes(&h, extra, strlen(extra));
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = wsync_dtype_size(p[i].dtype);
        int k;
        for (int d = 0; d < p[i].ndim; d++)
            bytes *= (uint64_t)p[i].shape[d];
        k = snprintf(ent, sizeof(ent), ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", p[i].name,
                     st_dtype(p[i].dtype));
        for (int d = 0; d < p[i].ndim; d++)
            k += snprintf(ent + k, sizeof(ent) - (size_t)k, "%s%lld", d ? "," : "",
                          (long long)p[i].shape[d]);
        snprintf(ent + k, sizeof(ent) - (size_t)k, "],\"data_offsets\":[%llu,%llu]}",
                 (unsigned long long)off, (unsigned long long)(off + bytes));
        wsync_put_bytes(&h, ent, strlen(ent));
        off += bytes;
    }
    wsync_put_u8(&h, '}');
    wsync_wbuf_init(&img);
    wsync_put_u64(&img, h.len);
    wsync_put_bytes(&img, h.data, h.len);
    if (!header_only)
        for (uint64_t i = 0; i < off; i++)
            wsync_put_u8(&img, 0);
    wsync_put_u32(&img, header_only ? (uint32_t)off : 0);
    write_seed("safetensors", name, img.data, img.len);
    wsync_wbuf_free(&h);
    wsync_wbuf_free(&img);
}

static void safetensors_seeds(const wsync_model_config_t *micro)
{
    wsync_param_t *p;
    size_t n, len;
    uint8_t *tiny = read_file(WSYNC_TESTDATA "/hf_qwen3_tiny/model.safetensors", &len);
    uint64_t hlen = 0;
    wsync_wbuf_t b;

    /* the tiny Qwen3's own header, its data area asked for by size */
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | tiny[i];
    wsync_wbuf_init(&b);
    wsync_put_bytes(&b, tiny, 8 + hlen);
    wsync_put_u32(&b, (uint32_t)(len - 8 - hlen));
    write_seed("safetensors", "hf_qwen3_tiny_header", b.data, b.len);
    wsync_wbuf_free(&b);
    free(tiny);

    if (wsync_model_params(micro, (wsync_dtype_t)0, &p, &n))
        die("micro params");
    st_seed("micro_qwen3", p, n, 0, NULL);
    st_seed("micro_qwen3_header", p, n, 1, NULL);
    wsync_model_params_free(p, n);
    {
        wsync_param_t mixed[] = {
            {"scale", WSYNC_DTYPE_F32, 0, {0}},
            {"w.fp8", WSYNC_DTYPE_F8E4M3FN, 2, {4, 8}},
            {"w.e5m2", WSYNC_DTYPE_F8E5M2, 1, {3}},
            {"table", WSYNC_DTYPE_U8, 3, {2, 2, 2}},
            {"half", WSYNC_DTYPE_F16, 4, {1, 2, 1, 2}},
            {"empty", WSYNC_DTYPE_BF16, 2, {0, 5}},
        };
        st_seed("mixed_dtypes", mixed, sizeof(mixed) / sizeof(mixed[0]), 0,
                ",\"ids\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[0,0]}");
    }
}

/* fuzz_delta: op 0, an encoded chunk (format 3) of each element size with every block mode
 * (block 0 SPARSE with escapes in its index stream: gaps of 299, then one of 4095 - 3900 - 1; 1
 * BITMAP, 2 PLAIN, 3 SAME), in a strided layout, and the same in format 4 (block 0's changes are
 * steps: STEPS); op 1, a list of 40 changes, and the same in format 4 with changes that are
 * steps where the xor flips bit 0 of the low byte. */
static void delta_seeds(void)
{
    enum { N = 3 * WSYNC_DELTA_BLOCK + 100 };
    const uint64_t B = WSYNC_DELTA_BLOCK;
    wsync_region_t r = {0, N, 1, N};
    char name[64];

    for (uint32_t i = 0; i < 4; i++) {
        uint32_t es = 1u << i;
        uint64_t cap = wsync_delta_max_bytes(N, es), len, hash;
        uint8_t *old = malloc((size_t)N * es), *nw = malloc((size_t)N * es);
        uint8_t *seed = malloc(2 + cap), ops[2 + 3 + 40 * 4];

        if (old == NULL || nw == NULL || seed == NULL)
            die("delta seeds: out of memory");
        for (uint64_t b = 0; b < (uint64_t)N * es; b++)
            old[b] = (uint8_t)(b * 131 + 7);
        memcpy(nw, old, (size_t)N * es);
        for (uint64_t e = 0; e < 14; e++)
            nw[e * 300 * es] ^= 1;
        nw[(B - 1) * es] ^= 1;
        for (uint64_t e = 0; e < 1000; e++)
            nw[(B + e * 4) * es] ^= 2;
        for (uint64_t e = 0; e < B; e++)
            nw[(2 * B + e) * es + es - 1] ^= 0x80;
        if (wsync_delta_encode(nw, old, &r, es, seed + 2, cap, &len, &hash, NULL) != WSYNC_OK)
            die("delta seeds: encode");
        seed[0] = (uint8_t)(i << 1);            /* op 0, esize 1 << i */
        seed[1] = 3 + 32;                       /* 4 columns, pitch 5 */
        snprintf(name, sizeof(name), "stream_es%u", es);
        write_seed("delta", name, seed, 2 + len);
        if (wsync_delta_encode_format(WSYNC_DELTA_FORMAT_STEPS, nw, old, &r, es, seed + 2, cap,
                                      &len, &hash, NULL) != WSYNC_OK)
            die("delta seeds: encode in format 4");
        snprintf(name, sizeof(name), "stream_es%u_steps", es);
        write_seed("delta", name, seed, 2 + len);

        ops[0] = (uint8_t)(i << 1 | 1);         /* op 1 */
        ops[1] = 7 + 64;                        /* 8 columns, pitch 10 */
        ops[2] = 4999 & 0xff;                   /* n = 1 + 4999 */
        ops[3] = 4999 >> 8;
        ops[4] = 42;
        for (int c = 0; c < 40; c++) {
            uint16_t e = (uint16_t)(c * 125);
            ops[5 + 4 * c] = (uint8_t)e;
            ops[6 + 4 * c] = (uint8_t)(e >> 8);
            ops[7 + 4 * c] = (uint8_t)c;
            ops[8 + 4 * c] = 0x5a;
        }
        snprintf(name, sizeof(name), "changes_es%u", es);
        write_seed("delta", name, ops, sizeof(ops));
        ops[0] |= 8;                            /* format 4 */
        for (int c = 0; c < 40; c++)
            ops[7 + 4 * c] = 0, ops[8 + 4 * c] = (uint8_t)(c % 4 == 3 ? 0x5a : 1);
        snprintf(name, sizeof(name), "changes_es%u_steps", es);
        write_seed("delta", name, ops, sizeof(ops));
        free(old);
        free(nw);
        free(seed);
    }
}

int main(int argc, char **argv)
{
    wsync_model_config_t tiny, micro;
    group_t g;

    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: fuzz_gen_corpus DIR   (e.g. tests/fuzz/corpus)\n"
               "Writes the fuzzers' seed corpora under DIR/<fuzzer>/ from the library's own "
               "encoders.\n");
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: fuzz_gen_corpus DIR   (e.g. tests/fuzz/corpus)\n");
        return 2;
    }
    outdir = argv[1];
    if (mkdir(outdir, 0755) != 0 && errno != EEXIST) {
        perror(outdir);
        return 1;
    }
    if (wsync_model_config_load(WSYNC_TESTDATA "/hf_qwen3_tiny/config.json", &tiny))
        die("tiny config");
    if (wsync_model_config_parse(micro_config, strlen(micro_config), &micro))
        die("micro config");

    group_make(&g, &tiny, 2, 2, 0, 64u << 10);
    frame_seeds(&g);
    plan_seeds(&g, "tiny_fsdp2_tp2", 0);
    group_free(&g);
    group_make(&g, &tiny, 2, 2, 1, 16u << 10);
    plan_seeds(&g, "tiny_fsdp2_tp2_fp8", 0);
    group_free(&g);
    group_make(&g, &tiny, 2, 2, 2, 16u << 10);
    plan_seeds(&g, "tiny_fsdp2_tp2_fp8w", 0);
    group_free(&g);
    group_make(&g, &micro, 2, 2, 0, 256);
    plan_seeds(&g, "micro_fsdp2_tp2", 1);
    group_free(&g);
    group_make(&g, &micro, 1, 1, 0, 4096);
    coordinator_seeds(&g);
    group_free(&g);
    group_make(&g, &micro, 3, 1, 0, 4096);
    plan_seeds(&g, "micro_fsdp3_tp1", 1);
    group_free(&g);
    compile_seed_misc();

    config_seeds();
    safetensors_seeds(&micro);
    delta_seeds();
    printf("wrote %d seeds under %s\n", nwritten, outdir);
    return 0;
}
