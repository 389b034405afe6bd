/* Transports probed on first need (issue 19.3: hundreds of participants on one host each paid
 * 0.1-0.2 s of CPU probing UCX and libfabric at wsync_ctx_create): a new ctx has probed nothing;
 * a sender that asks for ipc, or a receiver given WSYNC_SCHEME=ipc, probes only shm, tcp and
 * cuda_ipc; the info calls probe what they report, with the same answers as a ctx that probed
 * everything. The coordinator's explanation tells a transport a participant did not probe from one
 * it lacks, and a group of "auto" participants reads exactly as before. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/objects.h"
#include "core/registry.h"
#include "core/status.h"
#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

static uint32_t bit(const char *transport)
{
    int t = wsync_transport_index(transport);
    CHECK_MSG(t >= 0, "no transport '%s'", transport);
    return t >= 0 ? 1u << t : 0;
}

static void test_ctx_probes_nothing_until_asked(void)
{
    wsync_ctx_t *ctx = NULL, *full = NULL;
    wsync_component_info_t a, b;
    int ucx = wsync_transport_index("ucx");

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    CHECK_MSG(wsync_ctx_probed(ctx) == 0, "a new ctx probed %#x", wsync_ctx_probed(ctx));
    /* the info call probes the one transport it reports, and answers as a full probe does */
    CHECK_OK(wsync_transport_info(ctx, ucx, &a));
    CHECK_MSG(wsync_ctx_probed(ctx) == bit("ucx"), "probed %#x after ucx's info",
              wsync_ctx_probed(ctx));
    CHECK_OK(wsync_ctx_create(NULL, &full));
    CHECK(wsync_ctx_probe(full, wsync_scheme_transports(NULL)) ==
          wsync_ctx_probe(ctx, wsync_scheme_transports(NULL)));
    CHECK_OK(wsync_transport_info(full, ucx, &b));
    CHECK(a.available == b.available);
    CHECK_MSG(strcmp(a.reason, b.reason) == 0, "'%s' against '%s'", a.reason, b.reason);
    CHECK(strcmp(a.caps, b.caps) == 0);
    /* scheme info probes the scheme's transports */
    wsync_ctx_free(ctx);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    CHECK_OK(wsync_scheme_info(ctx, 0, &a));   /* ipc */
    CHECK(strcmp(a.name, "ipc") == 0);
    CHECK_MSG(wsync_ctx_probed(ctx) == wsync_scheme_transports("ipc"), "probed %#x",
              wsync_ctx_probed(ctx));
    CHECK(!(wsync_ctx_probed(ctx) & (bit("ucx") | bit("ofi") | bit("nccl"))));
    wsync_ctx_free(ctx);
    wsync_ctx_free(full);
}

static void test_members_probe_their_scheme(void)
{
    char addr[64];
    wsync_ctx_t *sctx = NULL, *rctx = NULL, *actx = NULL;
    wsync_sender_t *s = NULL;
    wsync_receiver_t *r = NULL, *ra = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    const uint32_t ipc = bit("shm") | bit("tcp") | bit("cuda_ipc");

    CHECK(wsync_scheme_transports("ipc") == ipc);
    CHECK(wsync_scheme_transports("store") == (ipc | bit("ucx") | bit("ofi")));
    CHECK(wsync_scheme_transports("auto") == (1u << WSYNC_NTRANSPORTS) - 1);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", proc_free_port());
    CHECK_OK(wsync_ctx_create(NULL, &sctx));
    sp.coordinator = addr;
    sp.nreceivers = 2;
    sp.scheme = "ipc";
    sp.timeout_ms = 10000;
    CHECK_OK(wsync_sender_create(sctx, &sp, &s));
    CHECK_MSG(wsync_ctx_probed(sctx) == ipc, "the ipc sender probed %#x, expected %#x",
              wsync_ctx_probed(sctx), ipc);

    /* a receiver has no scheme param: WSYNC_SCHEME=ipc narrows its probes */
    setenv("WSYNC_SCHEME", "ipc", 1);
    CHECK_OK(wsync_ctx_create(NULL, &rctx));
    rp.coordinator = addr;
    rp.nreceivers = 2;
    rp.rank = 0;
    rp.timeout_ms = 10000;
    CHECK_OK(wsync_receiver_create(rctx, &rp, &r));
    CHECK_MSG(wsync_ctx_probed(rctx) == ipc, "the WSYNC_SCHEME=ipc receiver probed %#x",
              wsync_ctx_probed(rctx));
    /* auto, as ever: everything */
    setenv("WSYNC_SCHEME", "auto", 1);
    CHECK_OK(wsync_ctx_create(NULL, &actx));
    rp.rank = 1;
    CHECK_OK(wsync_receiver_create(actx, &rp, &ra));
    CHECK_MSG(wsync_ctx_probed(actx) == (1u << WSYNC_NTRANSPORTS) - 1, "auto probed %#x",
              wsync_ctx_probed(actx));
    unsetenv("WSYNC_SCHEME");
    wsync_receiver_free(ra);
    wsync_receiver_free(r);
    wsync_sender_free(s);
    wsync_ctx_free(actx);
    wsync_ctx_free(rctx);
    wsync_ctx_free(sctx);
}

/* The group as the coordinator sees it: 1 sender and 2 receivers on one host, host memory. */
typedef struct {
    wsync_hello_t h[3];
    wsync_group_info_t g;
} group_t;

static void group_make(group_t *gr, const char *sender_scheme, const char *receiver_scheme)
{
    memset(gr, 0, sizeof(*gr));
    for (int i = 0; i < 3; i++) {
        wsync_hello_t *h = &gr->h[i];
        const char *scheme = i == 0 ? sender_scheme : receiver_scheme;
        h->role = i == 0 ? WSYNC_ROLE_SENDER : WSYNC_ROLE_RECEIVER;
        h->rank = i == 0 ? 0 : i - 1;
        h->nsenders = 1;
        h->nreceivers = 2;
        h->scheme = (char *)scheme;
        /* what a machine with every transport reports for what it probed */
        h->transports = wsync_scheme_transports(scheme) & ~bit("nccl") & ~bit("cuda_ipc");
        h->host_id = (char *)"host-a/net-1";
        h->hostname = (char *)"a";
    }
    gr->g.nsenders = 1;
    gr->g.nreceivers = 2;
    gr->g.senders = gr->h;
    gr->g.receivers = gr->h + 1;
    gr->g.mem_kinds = 1u << WSYNC_MEM_HOST;
}

/* Line of `scheme` in an explanation, into line. */
static void explain_line(const char *explain, const char *scheme, char *line, size_t len)
{
    char key[32];
    snprintf(key, sizeof(key), "%s: ", scheme);
    line[0] = '\0';
    for (const char *p = explain; p != NULL && *p != '\0';) {
        const char *end = strchr(p, '\n');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        if (strncmp(p, key, strlen(key)) == 0) {
            snprintf(line, len, "%.*s", (int)n, p);
            return;
        }
        p = end != NULL ? end + 1 : NULL;
    }
}

static void test_explain_tells_unprobed_from_missing(void)
{
    group_t gr;
    const wsync_scheme_ops_t *chosen = NULL, *c2 = NULL;
    char a[4096], b[4096], line[1024], plain[1024];
    group_t full;
    char why[1024];

    /* can the store serve this group on this build at all (UCX or libfabric compiled in)? */
    group_make(&full, "auto", "auto");
    int store_ok = wsync_scheme_find("store")->score(&full.g, why, sizeof(why)) > 0;

    /* every participant "auto": the explanation is wsync_negotiate's, byte for byte */
    CHECK_OK(wsync_negotiate(&full.g, "auto", &chosen, a, sizeof(a)));
    CHECK_OK(wsync_negotiate_probed(&full.g, "auto", &c2, b, sizeof(b)));
    CHECK(chosen == c2 && strcmp(chosen->name, "ipc") == 0);
    CHECK_MSG(strcmp(a, b) == 0, "auto group explained differently:\n%s\nagainst\n%s", b, a);

    /* the sender asked for ipc: the store is refused for what it did not probe */
    group_make(&gr, "ipc", NULL);
    CHECK_OK(wsync_negotiate(&gr.g, "ipc", &chosen, a, sizeof(a)));
    CHECK_OK(wsync_negotiate_probed(&gr.g, "ipc", &c2, b, sizeof(b)));
    CHECK(chosen == c2 && strcmp(c2->name, "ipc") == 0);
    explain_line(b, "store", line, sizeof(line));
    if (store_ok) {
        CHECK_MSG(strcmp(line, "store: refused: not probed: sender 0 asked for scheme 'ipc' and "
                               "probed only its transports (ucx, ofi not probed by 1 "
                               "participant)") == 0, "store's line: '%s'", line);
    } else {
        explain_line(a, "store", plain, sizeof(plain));
        CHECK_MSG(strcmp(line, plain) == 0, "no store here, yet '%s'", line);
        printf("  (no UCX or libfabric in this build: the store's 'not probed' line untested)\n");
    }
    /* nccl is refused for host memory whatever was probed: its line stays */
    explain_line(a, "nccl", plain, sizeof(plain));
    explain_line(b, "nccl", line, sizeof(line));
    CHECK_MSG(plain[0] != '\0' && strcmp(line, plain) == 0, "nccl: '%s' against '%s'", line,
              plain);
    explain_line(b, "ipc", line, sizeof(line));
    CHECK_MSG(strncmp(line, "ipc: chosen: all 3 participants share host a", 44) == 0, "'%s'",
              line);

    /* CUDA memory, everyone on one GPU and asking for ipc (a colocated group): nccl is refused
     * for the shared GPU, whatever was probed, and its line says so, not that NCCL is missing */
    group_t cu;
    static const uint8_t gpu0[16] = {0x9a, 1, 2, 3};
    const uint8_t *const one_gpu[3] = {gpu0, gpu0, gpu0};
    group_make(&cu, "auto", "auto");
    cu.g.mem_kinds = 1u << WSYNC_MEM_CUDA;
    cu.g.sender_gpu = one_gpu;
    cu.g.receiver_gpu = one_gpu + 1;
    for (int i = 0; i < 3; i++)
        cu.h[i].transports |= bit("nccl");
    const wsync_scheme_ops_t *nccl = wsync_scheme_find("nccl");
    char shared[1024];
    CHECK(nccl->score(&cu.g, shared, sizeof(shared)) == 0);
    CHECK_MSG(strstr(shared, "NCCL allows one rank per GPU") != NULL, "'%s'", shared);
    group_make(&gr, "ipc", "ipc");
    gr.g.mem_kinds = cu.g.mem_kinds;
    gr.g.sender_gpu = one_gpu;
    gr.g.receiver_gpu = one_gpu + 1;
    for (int i = 0; i < 3; i++)
        gr.h[i].transports |= bit("cuda_ipc");
    CHECK_OK(wsync_negotiate_probed(&gr.g, "ipc", &c2, b, sizeof(b)));
    explain_line(b, "nccl", line, sizeof(line));
    snprintf(plain, sizeof(plain), "nccl: refused: %s", shared);
    CHECK_MSG(strcmp(line, plain) == 0, "nccl's line '%s', want '%s'", line, plain);
    CHECK_MSG(strstr(line, "sender 0 and receiver 0 share GPU") != NULL, "'%s'", line);
    /* the sender asks for nccl (and probed it), the receivers asked for ipc: the error names
     * the shared GPU too, not NCCL missing where nobody looked */
    group_make(&gr, "nccl", "ipc");
    gr.g.mem_kinds = cu.g.mem_kinds;
    gr.g.sender_gpu = one_gpu;
    gr.g.receiver_gpu = one_gpu + 1;
    gr.h[0].transports |= bit("nccl");
    CHECK_ST(wsync_negotiate_probed(&gr.g, "nccl", &c2, b, sizeof(b)), WSYNC_ERR_UNSUPPORTED);
    snprintf(plain, sizeof(plain), "operation not supported: scheme 'nccl' was asked for but "
             "cannot serve this group: %s", shared);
    CHECK_MSG(strcmp(wsync_last_error(), plain) == 0, "'%s', want '%s'", wsync_last_error(),
              plain);

    /* a receiver that probed everything and lacks UCX and libfabric: lacking, not unprobed */
    group_make(&gr, "ipc", NULL);
    gr.h[2].transports &= ~(bit("ucx") | bit("ofi"));
    CHECK_OK(wsync_negotiate(&gr.g, "ipc", &chosen, a, sizeof(a)));
    CHECK_OK(wsync_negotiate_probed(&gr.g, "ipc", &c2, b, sizeof(b)));
    explain_line(a, "store", plain, sizeof(plain));
    explain_line(b, "store", line, sizeof(line));
    CHECK_MSG(strstr(line, "not probed") == NULL && strcmp(line, plain) == 0,
              "store: '%s' against '%s'", line, plain);

    /* the sender asks for the store, the receivers (WSYNC_SCHEME=ipc) probed only ipc's */
    group_make(&gr, "store", "ipc");
    CHECK_ST(wsync_negotiate_probed(&gr.g, "store", &c2, b, sizeof(b)), WSYNC_ERR_UNSUPPORTED);
    if (store_ok)
        CHECK_ERR_HAS("scheme 'store' was asked for but cannot serve this group: not probed: "
                      "receiver 0 asked for scheme 'ipc' and probed only its transports (ucx, "
                      "ofi not probed by 2 participants)");
    else
        CHECK_ERR_HAS("scheme 'store' was asked for but cannot serve this group");

    /* a scheme refused whatever was probed (nccl, host memory): the error is wsync_negotiate's,
     * word for word, its status named once */
    group_make(&gr, "nccl", "ipc");
    CHECK_ST(wsync_negotiate(&gr.g, "nccl", &chosen, a, sizeof(a)), WSYNC_ERR_UNSUPPORTED);
    snprintf(plain, sizeof(plain), "%s", wsync_last_error());
    CHECK_ST(wsync_negotiate_probed(&gr.g, "nccl", &c2, b, sizeof(b)), WSYNC_ERR_UNSUPPORTED);
    CHECK_MSG(strcmp(wsync_last_error(), plain) == 0, "'%s' against '%s'", wsync_last_error(),
              plain);
    const char *head = "operation not supported: scheme 'nccl' was asked for";
    CHECK_MSG(strncmp(plain, head, strlen(head)) == 0 &&
              strstr(plain, "not supported: operation not supported") == NULL, "'%s'", plain);
}

/* ---- several threads asking one ctx at once ------------------------------------------------- */

typedef struct {
    wsync_ctx_t *ctx;
    int first;                       /* transport this thread asks about first */
    int available[WSYNC_NTRANSPORTS];
    const char *reason[WSYNC_NTRANSPORTS];
} info_arg_t;

static void *info_thread(void *arg)
{
    info_arg_t *a = arg;
    for (int k = 0; k < WSYNC_NTRANSPORTS; k++) {
        int i = (a->first + k) % WSYNC_NTRANSPORTS;
        wsync_component_info_t info;
        if (wsync_transport_info(a->ctx, i, &info) != WSYNC_OK)
            return NULL;
        a->available[i] = info.available;
        a->reason[i] = info.reason;
    }
    return NULL;
}

static void test_threads_share_one_probe(void)
{
    wsync_ctx_t *ctx = NULL, *ref = NULL;
    info_arg_t args[6];
    pthread_t th[6];

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    CHECK_OK(wsync_ctx_create(NULL, &ref));
    wsync_ctx_probe(ref, wsync_scheme_transports(NULL));
    for (int t = 0; t < 6; t++) {
        memset(&args[t], 0, sizeof(args[t]));
        args[t].ctx = ctx;
        args[t].first = t;
        CHECK(pthread_create(&th[t], NULL, info_thread, &args[t]) == 0);
    }
    for (int t = 0; t < 6; t++)
        pthread_join(th[t], NULL);
    for (int i = 0; i < WSYNC_NTRANSPORTS; i++) {
        wsync_component_info_t want;
        CHECK_OK(wsync_transport_info(ref, i, &want));
        for (int t = 0; t < 6; t++) {
            /* each read right after its own call: a probe still under way would read 0 */
            CHECK_MSG(args[t].available[i] == want.available, "thread %d, transport %s: %d",
                      t, want.name, args[t].available[i]);
        }
        CHECK_MSG(args[0].reason[i] != NULL && strcmp(args[0].reason[i], want.reason) == 0,
                  "transport %s: '%s' against '%s'", want.name,
                  args[0].reason[i] ? args[0].reason[i] : "(none)", want.reason);
    }
    CHECK(wsync_ctx_probed(ctx) == wsync_scheme_transports(NULL));
    wsync_ctx_free(ref);
    wsync_ctx_free(ctx);
}

/* ---- a real group: the coordinator's explanation, end to end ---------------------------------- */

#define ROWS 4
#define COLS 8

typedef struct {
    const char *addr;
    uint16_t got[ROWS * COLS];
    int ok;
} recv_arg_t;

static void *receiver_thread(void *arg)
{
    recv_arg_t *a = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *r = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_piece_t piece;
    uint64_t v = 0;

    if (wsync_ctx_create(NULL, &ctx) != WSYNC_OK)
        return NULL;
    rp.coordinator = a->addr;
    rp.timeout_ms = 10000;
    if (wsync_receiver_create(ctx, &rp, &r) == WSYNC_OK) {
        memset(&piece, 0, sizeof(piece));
        piece.param = (wsync_param_t){"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}};
        piece.src.len[0] = ROWS;
        piece.src.len[1] = COLS;
        wsync_target_t t = {.name = "w", .dtype = WSYNC_DTYPE_BF16, .ndim = 2,
                            .shape = {ROWS, COLS}, .data = a->got, .mem = WSYNC_MEM_HOST,
                            .pieces = &piece, .npieces = 1};
        a->ok = wsync_receiver_add_target(r, &t) == WSYNC_OK &&
                wsync_receiver_wait(r, 10000, &v) == WSYNC_OK && v == 1;
        wsync_receiver_free(r);
    }
    wsync_ctx_free(ctx);
    return NULL;
}

static void test_group_explains_unprobed(void)
{
    char addr[64], why[1024], line[1024];
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint16_t w[ROWS * COLS];
    recv_arg_t ra;
    pthread_t th;
    group_t full;

    group_make(&full, "auto", "auto");
    int store_ok = wsync_scheme_find("store")->score(&full.g, why, sizeof(why)) > 0;
    for (int i = 0; i < ROWS * COLS; i++)
        w[i] = (uint16_t)(0x3f80 + i);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", proc_free_port());
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = addr;
    sp.scheme = "ipc";
    sp.timeout_ms = 10000;
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    wsync_shard_t sh = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}}, w,
                        WSYNC_MEM_HOST, 0};
    CHECK_OK(wsync_sender_add_shard(s, &sh));
    memset(&ra, 0, sizeof(ra));
    ra.addr = addr;
    CHECK(pthread_create(&th, NULL, receiver_thread, &ra) == 0);
    CHECK_OK(wsync_sender_push(s, 1));
    pthread_join(th, NULL);
    CHECK(ra.ok);
    CHECK_MSG(memcmp(ra.got, w, sizeof(w)) == 0, "the receiver's bytes differ from the shard");
    const char *explain = wsync_sender_explain(s);
    CHECK(explain != NULL);
    explain_line(explain != NULL ? explain : "", "store", line, sizeof(line));
    if (store_ok)
        CHECK_MSG(strcmp(line, "store: refused: not probed: sender 0 asked for scheme 'ipc' and "
                               "probed only its transports (ucx, ofi not probed by 1 "
                               "participant)") == 0, "store's line: '%s'", line);
    explain_line(explain != NULL ? explain : "", "ipc", line, sizeof(line));
    CHECK_MSG(strncmp(line, "ipc: chosen: all 2 participants share host", 42) == 0, "'%s'", line);
    /* the sender's ctx probed no more than ipc needs, the whole way through */
    CHECK_MSG(wsync_ctx_probed(ctx) == wsync_scheme_transports("ipc"), "probed %#x",
              wsync_ctx_probed(ctx));
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
}

int main(void)
{
    unsetenv("WSYNC_SCHEME");
    RUN(test_ctx_probes_nothing_until_asked);
    RUN(test_members_probe_their_scheme);
    RUN(test_explain_tells_unprobed_from_missing);
    RUN(test_threads_share_one_probe);
    RUN(test_group_explains_unprobed);
    return check_summary();
}
