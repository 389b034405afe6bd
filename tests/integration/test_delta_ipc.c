/* Delta versions over the ipc scheme on host memory (issue 17): the tiny Qwen3 of
 * ../shared/testdata, FSDP-2 trainer processes (sender 0's shards in malloc memory, staged;
 * sender 1's in wsync_mem_alloc memory, read in place) to vLLM's TP-2 layout in two receiver
 * processes, bf16 targets and block-FP8 targets (32 x 32 scales).
 *
 * Weights: every element starts at a value of its (param, global index); each version from 2 on
 * flips the lowest mantissa bit of about 3 % of the elements, chosen by a hash of (param, index,
 * version), so every process can make version v on its own.
 *
 * Each case is a group (or two, after a failure) pushing versions 1..NV. The reference is the
 * same versions pushed with delta = off (every byte plain), hashed per target (xxh3 of the
 * target's bytes, and of its scales for FP8 targets) by each receiver; every delta case's
 * targets must hash the same, version by version, and its senders' wire bytes of a delta
 * version must be well below the full version's.
 *  - delta on: version 1 full (base 0), 2..NV deltas; at version 4 receiver 0 re-points every
 *    target to a fresh poisoned buffer (set_target_data, as shadow mode and sleep/wake do): it
 *    takes version 4 in full and is still right; version 5 is a delta again for everyone.
 *  - FP8 targets: the quantized linear weights take full bytes, the rest deltas; same checks.
 *  - a version failed by a fault (delta.encoded:fail on sender 0 at version 2's first encoded
 *    chunk): every participant fails version 2; a new group then takes version 3 in full (base
 *    0) and right, and version 4 as a delta.
 *  - a corrupted delta (delta.encoded:corrupt flips a bit of version 2's first encoded chunk):
 *    the receiver that reads it fails version 2 with WSYNC_ERR_INTEGRITY naming the param and
 *    the sender, never holding wrong bytes as committed; the next group's versions are right.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tests/support/check.h"
#include "tests/support/delta_gen.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"
#include "xxhash.h"

#define CONFIG_PATH WSYNC_TESTDATA "/hf_qwen3_tiny/config.json"
#define NS 2
#define TP 2
#define NV 6                      /* versions 1..NV */
#define MAXT 64
#define TIMEOUT_MS 20000
#define POISON 0xAB
#define FP8_BLOCK 32

typedef struct {
    /* per version, per receiver, per target: xxh3 of its bytes (and scales); 0: not landed */
    uint64_t hash[NV + 1][TP][MAXT];
    int ntargets[TP];
    /* per version, per sender: push stats */
    wsync_push_stats_t stats[NV + 1][NS];
    int push_st[NV + 1][NS];
    int wait_st[NV + 1][TP];
    char wait_text[NV + 1][TP][512];
    char explain[2048];           /* sender 0's wsync_sender_explain after version 1 */
} results_t;

typedef struct {
    int port, port2;              /* the group, and the one made after a failed version */
    int fp8;
    const char *delta;            /* every participant's choice */
    int repoint_at;               /* receiver 0 re-points its targets before this version */
    const char *fault;            /* WSYNC_FAULT of sender 0, NULL: none */
    int fail_at;                  /* the version the fault fails, 0: none */
    int rank;
    results_t *res;
} group_t;

/* ---- the weights of version v: tests/support/delta_gen.h ----------------------------------- */

#define PERMILLE 30               /* elements a version changes: about 3 % */

/* ---- sender ---------------------------------------------------------------------------------- */

static wsync_status_t sender_group(const group_t *g, int port, wsync_ctx_t *ctx,
                                   wsync_shard_t *shards, size_t nshards, wsync_sender_t **out)
{
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    char addr[64];
    wsync_status_t st;

    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    sp.coordinator = addr;
    sp.rank = g->rank;
    sp.nranks = NS;
    sp.nreceivers = TP;
    sp.scheme = "ipc";
    sp.bucket_bytes = 256 << 10;   /* several buckets: delta slots are reused */
    sp.timeout_ms = TIMEOUT_MS;
    sp.delta = g->delta;
    if ((st = wsync_sender_create(ctx, &sp, out)) != WSYNC_OK)
        return st;
    for (size_t i = 0; i < nshards && st == WSYNC_OK; i++)
        st = wsync_sender_add_shard(*out, &shards[i]);
    return st;
}

static int run_sender(void *arg)
{
    const group_t *g = arg;
    wsync_model_config_t cfg;
    wsync_shard_t *shards = NULL;
    size_t nshards = 0;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    int port = g->port;

    if (g->fault != NULL && g->rank == 0)
        setenv("WSYNC_FAULT", g->fault, 1);
    CHECK_OK(wsync_model_config_load(CONFIG_PATH, &cfg));
    CHECK_OK(wsync_layout_fsdp_shards(&cfg, WSYNC_DTYPE_BF16, g->rank, NS, &shards, &nshards));
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    if (check_failures > 0)
        return 1;
    for (size_t i = 0; i < nshards; i++) {
        uint64_t n = dgen_shard_elems(&shards[i]), e0 = dgen_shard_first(&shards[i]);
        uint16_t *p = NULL;
        if (g->rank == 1)
            CHECK_OK(wsync_mem_alloc(ctx, n * 2 + 2, (void **)&p));
        else
            p = malloc(n * 2 + 2);
        if (p == NULL)
            return 1;
        for (uint64_t j = 0; j < n; j++)
            p[j] = dgen_start(i, e0 + j);
        shards[i].data = p;
    }
    CHECK_OK(sender_group(g, port, ctx, shards, nshards, &s));
    for (uint64_t v = 1; v <= NV && check_failures == 0; v++) {
        for (size_t i = 0; i < nshards; i++)
            dgen_step((uint16_t *)(uintptr_t)shards[i].data, dgen_shard_elems(&shards[i]), i,
                      dgen_shard_first(&shards[i]), v, PERMILLE);
        wsync_status_t st = wsync_sender_push(s, v);
        g->res->push_st[v][g->rank] = st;
        if ((int)v == g->fail_at) {
            CHECK_MSG(st != WSYNC_OK, "sender %d: version %llu should have failed", g->rank,
                      (unsigned long long)v);
            wsync_sender_free(s);
            s = NULL;
            port = g->port2;
            CHECK_OK(sender_group(g, port, ctx, shards, nshards, &s));
            continue;
        }
        CHECK_MSG(st == WSYNC_OK, "sender %d: push %llu: %s", g->rank, (unsigned long long)v,
                  wsync_last_error());
        CHECK_OK(wsync_sender_stats(s, &g->res->stats[v][g->rank]));
        if (v == 1 && g->rank == 0)
            snprintf(g->res->explain, sizeof(g->res->explain), "%s", wsync_sender_explain(s));
    }
    wsync_sender_free(s);
    for (size_t i = 0; i < nshards; i++) {
        if (g->rank == 1)
            wsync_mem_free(ctx, (void *)(uintptr_t)shards[i].data);
        else
            free((void *)(uintptr_t)shards[i].data);
        shards[i].data = NULL;
    }
    wsync_layout_shards_free(shards, nshards);
    wsync_ctx_free(ctx);
    return check_failures > 0;
}

/* ---- receiver -------------------------------------------------------------------------------- */

typedef struct {
    wsync_target_t *targets;
    size_t n;
    size_t bytes[MAXT], nscales[MAXT];
    void *bufs[2][MAXT];
    float *scales[MAXT];
} rtargets_t;

static wsync_status_t receiver_group(const group_t *g, int port, wsync_ctx_t *ctx, rtargets_t *t,
                                     int set, wsync_receiver_t **out)
{
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    char addr[64];
    wsync_status_t st;

    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    rp.coordinator = addr;
    rp.rank = g->rank;
    rp.nreceivers = TP;
    rp.timeout_ms = TIMEOUT_MS;
    rp.delta = g->delta;
    if ((st = wsync_receiver_create(ctx, &rp, out)) != WSYNC_OK)
        return st;
    for (size_t i = 0; i < t->n && st == WSYNC_OK; i++) {
        t->targets[i].data = t->bufs[set][i];
        st = wsync_receiver_add_target(*out, &t->targets[i]);
    }
    return st;
}

static uint64_t target_hash(const rtargets_t *t, int set, size_t i)
{
    XXH3_state_t *x = XXH3_createState();
    XXH3_64bits_reset(x);
    XXH3_64bits_update(x, t->bufs[set][i], t->bytes[i]);
    if (t->scales[i] != NULL)
        XXH3_64bits_update(x, t->scales[i], t->nscales[i] * sizeof(float));
    uint64_t h = XXH3_64bits_digest(x);
    XXH3_freeState(x);
    return h;
}

static int run_receiver(void *arg)
{
    const group_t *g = arg;
    wsync_model_config_t cfg;
    wsync_tp_options_t opts = WSYNC_TP_OPTIONS_INIT;
    rtargets_t t;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    int set = 0, port = g->port;

    memset(&t, 0, sizeof(t));
    CHECK_OK(wsync_model_config_load(CONFIG_PATH, &cfg));
    if (g->fp8) {
        opts.quant.scheme = WSYNC_QUANT_BLOCK;
        opts.quant.block_rows = opts.quant.block_cols = FP8_BLOCK;
    }
    CHECK_OK(wsync_layout_tp_targets(&cfg, g->rank, TP, &opts, &t.targets, &t.n));
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    if (check_failures > 0 || t.n > MAXT)
        return 1;
    g->res->ntargets[g->rank] = (int)t.n;
    for (size_t i = 0; i < t.n; i++) {
        t.bytes[i] = wsync_target_bytes(&t.targets[i]);
        for (int k = 0; k < 2; k++) {
            t.bufs[k][i] = malloc(t.bytes[i] + 1);
            memset(t.bufs[k][i], POISON, t.bytes[i]);
        }
        if (t.targets[i].quant.scheme != WSYNC_QUANT_NONE) {
            t.nscales[i] = wsync_target_scale_count(&t.targets[i]);
            t.scales[i] = calloc(t.nscales[i] + 1, sizeof(float));
            t.targets[i].quant.scales = t.scales[i];
        }
    }
    CHECK_OK(receiver_group(g, port, ctx, &t, set, &rv));
    for (uint64_t v = 1; v <= NV && check_failures == 0; v++) {
        uint64_t got = 0;
        if ((int)v == g->repoint_at && g->rank == 0) {
            /* a fresh buffer (poisoned): it must take this version whole */
            set = 1;
            for (size_t i = 0; i < t.n; i++)
                CHECK_OK(wsync_receiver_set_target_data(rv, t.targets[i].name, t.bufs[set][i], NULL));
        }
        wsync_status_t st = wsync_receiver_wait(rv, TIMEOUT_MS, &got);
        g->res->wait_st[v][g->rank] = st;
        if (st != WSYNC_OK && port == g->port && g->fail_at > 0 &&
            ((int)v == g->fail_at || (int)v == g->fail_at + 1)) {
            /* the failed version, or the one after it for a receiver that had all its bytes of
             * the failed one (it committed; the group failed after) */
            if ((int)v == g->fail_at)
                snprintf(g->res->wait_text[v][g->rank], sizeof(g->res->wait_text[v][g->rank]),
                         "%s", wsync_last_error());
            /* a new group with the same (possibly torn) buffers: it must take the next in full */
            wsync_receiver_free(rv);
            rv = NULL;
            port = g->port2;
            CHECK_OK(receiver_group(g, port, ctx, &t, set, &rv));
            if ((int)v == g->fail_at + 1)
                v--;   /* wait for it again, from the new group */
            continue;
        }
        CHECK_MSG(st == WSYNC_OK && got == v, "receiver %d: wait for version %llu: %s (got %llu)",
                  g->rank, (unsigned long long)v, st == WSYNC_OK ? "ok" : wsync_last_error(),
                  (unsigned long long)got);
        for (size_t i = 0; i < t.n && st == WSYNC_OK; i++)
            g->res->hash[v][g->rank][i] = target_hash(&t, set, i);
    }
    wsync_receiver_free(rv);
    for (size_t i = 0; i < t.n; i++) {
        t.targets[i].quant.scales = NULL;
        free(t.bufs[0][i]);
        free(t.bufs[1][i]);
        free(t.scales[i]);
    }
    wsync_layout_targets_free(t.targets, t.n);
    wsync_ctx_free(ctx);
    return check_failures > 0;
}

/* ---- cases ----------------------------------------------------------------------------------- */

static results_t *run_group(group_t *proto)
{
    results_t *res = mmap(NULL, sizeof(results_t), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    group_t g[NS + TP];
    pid_t pids[NS + TP];
    int codes[NS + TP];

    if (res == MAP_FAILED)
        return NULL;
    memset(res, 0, sizeof(*res));
    proto->port = proc_free_port();
    proto->port2 = proc_free_port();
    proto->res = res;
    for (int i = 0; i < NS + TP; i++) {
        g[i] = *proto;
        g[i].rank = i < NS ? i : i - NS;
        pids[i] = proc_spawn(i < NS ? run_sender : run_receiver, &g[i], 120);
    }
    int bad = proc_wait_all(pids, NS + TP, 120000, codes);
    CHECK_MSG(bad == 0, "%d participants failed (sender codes %d %d, receiver codes %d %d)", bad,
              codes[0], codes[1], codes[2], codes[3]);
    return res;
}

/* The delta run's targets equal the full run's, version by version (skip: a failed version). */
static void compare(const results_t *ref, const results_t *got, int skip)
{
    for (int r = 0; r < TP; r++) {
        CHECK(got->ntargets[r] == ref->ntargets[r] && ref->ntargets[r] > 0);
        for (int v = 1; v <= NV; v++) {
            if (v == skip)
                continue;
            for (int i = 0; i < ref->ntargets[r]; i++)
                CHECK_MSG(ref->hash[v][r][i] != 0 && got->hash[v][r][i] == ref->hash[v][r][i],
                          "receiver %d, version %d, target %d: %016llx, the full transfer's "
                          "%016llx", r, v, i, (unsigned long long)got->hash[v][r][i],
                          (unsigned long long)ref->hash[v][r][i]);
        }
    }
}

static uint64_t wire(const results_t *res, int v)
{
    return res->stats[v][0].bytes_wire + res->stats[v][1].bytes_wire;
}

static void print_wire(const char *what, const results_t *res)
{
    printf("  %s wire bytes (encoded + plain) by version:", what);
    for (int v = 1; v <= NV; v++)
        printf(" %llu (%llu + %llu, base %llu)", (unsigned long long)wire(res, v),
               (unsigned long long)(res->stats[v][0].bytes_encoded + res->stats[v][1].bytes_encoded),
               (unsigned long long)(res->stats[v][0].bytes_plain + res->stats[v][1].bytes_plain),
               (unsigned long long)res->stats[v][0].base_version);
    printf("\n");
}

static void case_delta(int fp8)
{
    group_t full = {.fp8 = fp8, .delta = "off"};
    group_t delta = {.fp8 = fp8, .delta = "on", .repoint_at = 4};
    results_t *ref = run_group(&full), *got = run_group(&delta);

    if (ref == NULL || got == NULL || check_failures > 0)
        return;
    compare(ref, got, 0);
    print_wire(fp8 ? "fp8 delta" : "bf16 delta", got);
    /* the group's mode and why, a line of the explanation */
    CHECK_MSG(strstr(ref->explain, "delta: off (sender 0 asked for delta = off)") != NULL, "%s",
              ref->explain);
    CHECK_MSG(strstr(got->explain, "delta: on (sender 0 asked for delta = on)") != NULL, "%s",
              got->explain);
    CHECK_MSG((strstr(got->explain, "quantized FP8 targets take every version in full") != NULL) ==
                  fp8, "%s", got->explain);
    /* delta off: no wire accounting; on: version 1 full, later ones against the one before */
    CHECK(wire(ref, 2) == 0 && ref->stats[2][0].base_version == 0);
    CHECK(got->stats[1][0].base_version == 0 && got->stats[1][0].bytes_encoded == 0);
    uint64_t full_bytes = wire(got, 1);
    CHECK(full_bytes > 0);
    for (int v = 2; v <= NV; v++) {
        CHECK_MSG(got->stats[v][0].base_version == (uint64_t)v - 1 &&
                      got->stats[v][1].base_version == (uint64_t)v - 1,
                  "version %d encoded against %llu", v,
                  (unsigned long long)got->stats[v][0].base_version);
        /* FP8 targets: sender 1's only unquantized chunks are norms of a few hundred bytes,
         * whose encodings (header and table included) pass the host cut-off of 0.2 of their
         * plain bytes: they go plain (docs/delta.md "When a chunk goes plain") */
        CHECK(fp8 ? got->stats[v][0].bytes_encoded + got->stats[v][1].bytes_encoded > 0
                  : got->stats[v][0].bytes_encoded > 0 && got->stats[v][1].bytes_encoded > 0);
        if (v == 4)
            continue;   /* receiver 0 took it in full */
        /* ~3 % of elements changed: sparse blocks; FP8 targets' weights still go plain */
        CHECK_MSG(wire(got, v) * (fp8 ? 1 : 4) < full_bytes,
                  "version %d: %llu wire bytes against %llu in full", v,
                  (unsigned long long)wire(got, v), (unsigned long long)full_bytes);
    }
    /* version 4: receiver 0's chunks went plain, receiver 1's encoded */
    CHECK_MSG(wire(got, 4) > wire(got, 5), "version 4 (one receiver re-pointed): %llu bytes, "
              "version 5: %llu", (unsigned long long)wire(got, 4), (unsigned long long)wire(got, 5));
    munmap(ref, sizeof(*ref));
    munmap(got, sizeof(*got));
}

static void case_delta_bf16(void) { case_delta(0); }
static void case_delta_fp8(void) { case_delta(1); }

static void case_fault(const char *fault, int fail_at, wsync_status_t want_st, const char *needle)
{
    group_t full = {.delta = "off"};
    group_t delta = {.delta = "on", .fault = fault, .fail_at = fail_at};
    results_t *ref = run_group(&full), *got = run_group(&delta);

    if (ref == NULL || got == NULL || check_failures > 0)
        return;
    compare(ref, got, fail_at);
    print_wire(fault, got);
    int named = 0;
    for (int r = 0; r < TP; r++) {
        if ((want_st == WSYNC_OK || got->wait_st[fail_at][r] == (int)want_st) &&
            strstr(got->wait_text[fail_at][r], needle) != NULL)
            named++;
        printf("  receiver %d, version %d: %s: %s\n", r, fail_at,
               wsync_status_str((wsync_status_t)got->wait_st[fail_at][r]),
               got->wait_text[fail_at][r]);
    }
    CHECK_MSG(named >= 1, "no receiver failed version %d with %s naming '%s'", fail_at,
              want_st == WSYNC_OK ? "an error" : wsync_status_str(want_st), needle);
    CHECK(got->push_st[fail_at][0] != WSYNC_OK && got->push_st[fail_at][1] != WSYNC_OK);
    /* the next group starts from nothing: full, then deltas again */
    CHECK(got->stats[fail_at + 1][0].base_version == 0);
    CHECK(got->stats[fail_at + 1][0].bytes_encoded == 0);
    CHECK(got->stats[fail_at + 2][0].base_version == (uint64_t)fail_at + 1);
    CHECK(wire(got, fail_at + 2) * 4 < wire(got, fail_at + 1));
    munmap(ref, sizeof(*ref));
    munmap(got, sizeof(*got));
}

static void case_failed_version(void)
{
    /* sender 0 fails at version 2's first encoded chunk; every member reports the group's first
     * failure, the injected one */
    case_fault("delta.encoded:fail@1", 2, WSYNC_OK, "injected fault delta.encoded");
}

static void case_corrupt_delta(void)
{
    case_fault("delta.encoded:corrupt@1", 2, WSYNC_ERR_INTEGRITY, "param '");
}

/* Bad values name the field (or the variable) and what is accepted. Last: it creates a context
 * in this process, and the other cases fork. */
static void case_params(void)
{
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = rp.coordinator = "127.0.0.1:1";
    sp.delta = "maybe";
    CHECK_ST(wsync_sender_create(ctx, &sp, &s), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("sender: delta = 'maybe', expected off, on or auto");
    sp.delta = "on";
    sp.delta_baseline = "gpu";
    CHECK_ST(wsync_sender_create(ctx, &sp, &s), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("sender: delta_baseline = 'gpu', expected device or host");
    setenv("WSYNC_DELTA", "sometimes", 1);
    CHECK_ST(wsync_receiver_create(ctx, &rp, &rv), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("receiver: WSYNC_DELTA = 'sometimes', expected off, on or auto");
    unsetenv("WSYNC_DELTA");
    CHECK(s == NULL && rv == NULL);
    wsync_ctx_free(ctx);
}

/* tests/support/delta_gen.c gives the versions these tests' own copies of the generator gave
 * (test_delta_ipc.c, test_delta_store.c, test_delta_cutoff.c at e99fd25): hashes of what it makes,
 * computed once with that code and written here. */
static void case_generator(void)
{
    enum { N = 3000, M = 4096 };
    static const uint64_t want[7] = {0, 0x49bcd12903b3fd6full, 0x9050f8fa7f6a323dull,
                                     0x07d1295ad4891853ull, 0x7925f3c0990079d6ull,
                                     0x2adf86d47a96934bull, 0x17a4e43b07c18c95ull};
    static const uint64_t nflip[7] = {0, 0, 96, 88, 79, 88, 80};
    static uint16_t w[N], c[M];
    const uint64_t e0 = 123456;

    CHECK_MSG(dgen_start(0, 0) == 0x3f18 && dgen_start(7, 99) == 0xbdc0,
              "start values 0x%04x 0x%04x, expected 0x3f18 0xbdc0", dgen_start(0, 0),
              dgen_start(7, 99));
    /* test_delta_ipc.c and test_delta_store.c: param 5, elements [e0, e0 + N), 3 % a version */
    for (uint64_t j = 0; j < N; j++)
        w[j] = dgen_start(5, e0 + j);
    for (uint64_t v = 1; v <= 6; v++) {
        uint64_t n = dgen_step(w, N, 5, e0, v, 30);
        uint64_t h = XXH3_64bits(w, sizeof(w));
        CHECK_MSG(n == nflip[v] && h == want[v], "version %llu: %llu flips, hash %016llx; "
                  "expected %llu, %016llx", (unsigned long long)v, (unsigned long long)n,
                  (unsigned long long)h, (unsigned long long)nflip[v],
                  (unsigned long long)want[v]);
    }
    int agree = 1;
    for (uint64_t j = 0; j < N; j++)
        agree &= dgen_value_at(5, e0 + j, 6, 30) == w[j];
    CHECK_MSG(agree && dgen_value_at(5, e0 + 17, 6, 30) == 0x3f61,
              "dgen_value_at disagrees with the stepped versions");
    /* test_delta_cutoff.c: its own start values, 600 then 20 permille (case_reprobe's pattern) */
    for (uint64_t e = 0; e < M; e++)
        c[e] = (uint16_t)(0x3c00 + (dgen_mix(0, e, 0) & 0x3ff));
    CHECK(XXH3_64bits(c, sizeof(c)) == 0x5cca90f60566d982ull);
    CHECK(dgen_step(c, M, 0, 0, 2, 600) == 2470);
    CHECK(XXH3_64bits(c, sizeof(c)) == 0x40e9f7adcfabe791ull);
    CHECK(dgen_step(c, M, 0, 0, 3, 20) == 88);
    CHECK(XXH3_64bits(c, sizeof(c)) == 0x9c166c3260854625ull);
    CHECK(dgen_step(c, M, 0, 0, 1, 1000) == 0);   /* version 1 flips nothing */
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(case_generator);
    RUN(case_delta_bf16);
    RUN(case_delta_fp8);
    RUN(case_corrupt_delta);
    RUN(case_failed_version);
    RUN(case_params);
    return check_summary();
}
