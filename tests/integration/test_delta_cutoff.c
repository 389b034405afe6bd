/* The delta cut-off (params.delta_cutoff, WSYNC_DELTA_CUTOFF; docs/delta.md "When a chunk goes
 * plain"), on host memory over the ipc scheme: one sender process, one receiver process, delta =
 * on, two bf16 params of ROWS x COLS, each one chunk:
 *  - "dense": from version 2 on, about 60 % of its elements change each version (its encoding
 *    takes about two thirds of its plain bytes);
 *  - "sparse": about 2 % change (about 4 % of its plain bytes).
 * With the default cut-off of host shards (0.2) the dense chunk travels plain (push stats: its
 * bytes in bytes_plain, not in bytes_encoded) and the sparse one encoded; with delta_cutoff = 1
 * (the param, and WSYNC_DELTA_CUTOFF=1) both travel encoded. Every version's target bytes equal
 * the values the receiver computes on its own from (param, element, version). A chunk that went
 * plain by the cut-off is not encoded for the next WSYNC_DELTA_REPROBE - 1 versions, then probed
 * again (case_reprobe: dense once, then sparse). The param and the variable are refused at or below 0, above 1 and NaN, naming delta_cutoff and the value. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tests/support/check.h"
#include "tests/support/delta_gen.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#define ROWS 64
#define COLS 4096
#define NELEM ((uint64_t)ROWS * COLS)
#define PLAIN (NELEM * 2)               /* bytes of one param */
#define NP 2                            /* 0: dense, 1: sparse */
#define NV 10                           /* versions 1..NV at most */
#define TIMEOUT_MS 20000

static const char *const names[NP] = {"dense.weight", "sparse.weight"};
static const int permille[NP] = {600, 20};

typedef struct {
    wsync_push_stats_t stats[NV + 1];
    int push_ok[NV + 1];
    int right[NV + 1];              /* the receiver's targets equal the values, version v */
    uint64_t changed[NV + 1][NP];   /* elements that changed, version v (the receiver counts) */
} results_t;

typedef struct {
    int port;
    int nv;                         /* versions 1..nv */
    int reprobe;                    /* 1: "dense" is dense at version 2 only, 2 % after */
    double cutoff;                  /* the sender's params.delta_cutoff */
    const char *env;                /* WSYNC_DELTA_CUTOFF of the sender, NULL: unset */
    results_t *res;
} group_t;

/* Param p at version v, from version v - 1 in w (tests/support/delta_gen.h): a start value of
 * its own (v = 1), its lowest bit flipped at each version from 2 on where (p, e, v) draws under
 * the param's permille. Returns the elements that flipped. */
static uint64_t make_version(const group_t *g, int p, uint64_t v, uint16_t *w)
{
    unsigned pm = (unsigned)(g->reprobe && v > 2 ? permille[1] : permille[p]);
    if (v == 1) {
        for (uint64_t e = 0; e < NELEM; e++)
            w[e] = (uint16_t)(0x3c00 + (dgen_mix((uint64_t)p, e, 0) & 0x3ff));
        return 0;
    }
    return dgen_step(w, NELEM, (uint64_t)p, 0, v, pm);
}

static wsync_param_t param_of(int p)
{
    wsync_param_t pm = {names[p], WSYNC_DTYPE_BF16, 2, {ROWS, COLS}};
    return pm;
}

static int run_sender(void *arg)
{
    const group_t *g = arg;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    uint16_t *w[NP];
    char addr[64];

    if (g->env != NULL)
        setenv("WSYNC_DELTA_CUTOFF", g->env, 1);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", g->port);
    sp.coordinator = addr;
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = 1;
    sp.scheme = "ipc";
    sp.timeout_ms = TIMEOUT_MS;
    sp.delta = "on";
    sp.delta_cutoff = g->cutoff;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    for (int p = 0; p < NP && check_failures == 0; p++) {
        wsync_shard_t sh;
        memset(&sh, 0, sizeof(sh));
        w[p] = malloc(PLAIN);
        if (w[p] == NULL)
            return 1;
        make_version(g, p, 1, w[p]);
        sh.param = param_of(p);
        sh.box.len[0] = ROWS;
        sh.box.len[1] = COLS;
        sh.data = w[p];
        sh.mem = WSYNC_MEM_HOST;
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    for (uint64_t v = 1; v <= (uint64_t)g->nv && check_failures == 0; v++) {
        for (int p = 0; p < NP && v >= 2; p++)
            make_version(g, p, v, w[p]);
        wsync_status_t st = wsync_sender_push(s, v);
        CHECK_MSG(st == WSYNC_OK, "push %llu: %s", (unsigned long long)v, wsync_last_error());
        g->res->push_ok[v] = st == WSYNC_OK;
        CHECK_OK(wsync_sender_stats(s, &g->res->stats[v]));
    }
    wsync_sender_free(s);
    for (int p = 0; p < NP; p++)
        free(w[p]);
    wsync_ctx_free(ctx);
    return check_failures > 0;
}

static int run_receiver(void *arg)
{
    const group_t *g = arg;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *r = NULL;
    uint16_t *t[NP], *want[NP];
    wsync_piece_t pieces[NP];
    char addr[64];

    snprintf(addr, sizeof(addr), "127.0.0.1:%d", g->port);
    rp.coordinator = addr;
    rp.rank = 0;
    rp.nreceivers = 1;
    rp.timeout_ms = TIMEOUT_MS;
    rp.delta = "on";
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    CHECK_OK(wsync_receiver_create(ctx, &rp, &r));
    for (int p = 0; p < NP && check_failures == 0; p++) {
        wsync_target_t tg;
        memset(&tg, 0, sizeof(tg));
        memset(&pieces[p], 0, sizeof(pieces[p]));
        t[p] = malloc(PLAIN);
        want[p] = malloc(PLAIN);
        if (t[p] == NULL || want[p] == NULL)
            return 1;
        memset(t[p], 0xab, PLAIN);
        pieces[p].param = param_of(p);
        pieces[p].src.len[0] = ROWS;
        pieces[p].src.len[1] = COLS;
        tg.name = names[p];
        tg.dtype = WSYNC_DTYPE_BF16;
        tg.ndim = 2;
        tg.shape[0] = ROWS;
        tg.shape[1] = COLS;
        tg.data = t[p];
        tg.mem = WSYNC_MEM_HOST;
        tg.pieces = &pieces[p];
        tg.npieces = 1;
        CHECK_OK(wsync_receiver_add_target(r, &tg));
    }
    for (uint64_t v = 1; v <= (uint64_t)g->nv && check_failures == 0; v++) {
        uint64_t got = 0;
        wsync_status_t st = wsync_receiver_wait(r, TIMEOUT_MS, &got);
        CHECK_MSG(st == WSYNC_OK && got == v, "wait for version %llu: %s (got %llu)",
                  (unsigned long long)v, st == WSYNC_OK ? "ok" : wsync_last_error(),
                  (unsigned long long)got);
        int right = st == WSYNC_OK;
        for (int p = 0; p < NP; p++) {
            g->res->changed[v][p] += make_version(g, p, v, want[p]);
            if (memcmp(t[p], want[p], PLAIN) != 0) {
                uint64_t e = 0;
                while (t[p][e] == want[p][e])
                    e++;
                CHECK_MSG(0, "version %llu: param %s element %llu is 0x%04x, expected 0x%04x",
                          (unsigned long long)v, names[p], (unsigned long long)e, t[p][e],
                          want[p][e]);
                right = 0;
            }
        }
        g->res->right[v] = right;
    }
    wsync_receiver_free(r);
    for (int p = 0; p < NP; p++) {
        free(t[p]);
        free(want[p]);
    }
    wsync_ctx_free(ctx);
    return check_failures > 0;
}

static results_t *run_group(int nv, int reprobe, double cutoff, const char *env)
{
    results_t *res = mmap(NULL, sizeof(results_t), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    group_t g = {proc_free_port(), nv, reprobe, cutoff, env, res};
    pid_t pids[2];
    int codes[2];

    if (res == MAP_FAILED)
        return NULL;
    memset(res, 0, sizeof(*res));
    fflush(stdout);   /* the children must not print what the parent buffered */
    pids[0] = proc_spawn(run_sender, &g, 60);
    pids[1] = proc_spawn(run_receiver, &g, 60);
    int bad = proc_wait_all(pids, 2, 60000, codes);
    CHECK_MSG(bad == 0, "%d participants failed (sender code %d, receiver code %d)", bad, codes[0],
              codes[1]);
    return res;
}

/* Version 1 goes full (no base); from version 2 on: the expected split of the bytes. */
static void check_versions(const results_t *res, int dense_plain)
{
    for (uint64_t v = 1; v <= 3; v++) {
        const wsync_push_stats_t *st = &res->stats[v];
        CHECK_MSG(res->push_ok[v] && res->right[v], "version %llu: pushed %d, right %d",
                  (unsigned long long)v, res->push_ok[v], res->right[v]);
        printf("  version %llu: base %llu, encoded %llu, plain %llu bytes (changed: dense %.1f %%, "
               "sparse %.1f %%)\n", (unsigned long long)v, (unsigned long long)st->base_version,
               (unsigned long long)st->bytes_encoded, (unsigned long long)st->bytes_plain,
               100.0 * (double)res->changed[v][0] / (double)NELEM,
               100.0 * (double)res->changed[v][1] / (double)NELEM);
        fflush(stdout);
        if (v == 1) {
            CHECK(st->base_version == 0 && st->bytes_encoded == 0 && st->bytes_plain == NP * PLAIN);
            continue;
        }
        CHECK(st->base_version == v - 1);
        CHECK(st->bytes_wire == st->bytes_encoded + st->bytes_plain);
        /* the generator's densities, as the test means them */
        CHECK(res->changed[v][0] > NELEM * 55 / 100 && res->changed[v][0] < NELEM * 65 / 100);
        CHECK(res->changed[v][1] > NELEM * 15 / 1000 && res->changed[v][1] < NELEM * 25 / 1000);
        if (dense_plain) {
            /* the dense chunk plain, the sparse one encoded at a few % of its bytes */
            CHECK_MSG(st->bytes_plain == PLAIN, "version %llu: %llu bytes plain, expected the "
                      "dense chunk's %llu", (unsigned long long)v,
                      (unsigned long long)st->bytes_plain, (unsigned long long)PLAIN);
            CHECK_MSG(st->bytes_encoded > 0 && st->bytes_encoded < PLAIN / 10,
                      "version %llu: %llu bytes encoded, expected the sparse chunk's few %%",
                      (unsigned long long)v, (unsigned long long)st->bytes_encoded);
        } else {
            /* both encoded: the dense one alone takes more than half its plain bytes */
            CHECK_MSG(st->bytes_plain == 0, "version %llu: %llu bytes plain, expected none",
                      (unsigned long long)v, (unsigned long long)st->bytes_plain);
            CHECK_MSG(st->bytes_encoded > PLAIN / 2 && st->bytes_encoded < PLAIN,
                      "version %llu: %llu bytes encoded", (unsigned long long)v,
                      (unsigned long long)st->bytes_encoded);
        }
    }
}

static void case_default(void)
{
    unsetenv("WSYNC_DELTA_CUTOFF");
    results_t *res = run_group(3, 0, 0.0, NULL);
    if (res != NULL)
        check_versions(res, 1);
}

static void case_param_one(void)
{
    unsetenv("WSYNC_DELTA_CUTOFF");
    results_t *res = run_group(3, 0, 1.0, NULL);
    if (res != NULL)
        check_versions(res, 0);
}

static void case_env_one(void)
{
    results_t *res = run_group(3, 0, 0.0, "1");
    if (res != NULL)
        check_versions(res, 0);
}

/* "dense" at 60 % in version 2 only, 2 % after: it goes plain by the cut-off at version 2, is
 * not encoded in versions 3 .. 9 (plain, though sparse again: WSYNC_DELTA_REPROBE - 1 versions),
 * and is probed and encoded again at version 10; every version right. */
static void case_reprobe(void)
{
    unsetenv("WSYNC_DELTA_CUTOFF");
    results_t *res = run_group(10, 1, 0.0, NULL);
    if (res == NULL)
        return;
    for (uint64_t v = 2; v <= 10; v++) {
        const wsync_push_stats_t *st = &res->stats[v];
        CHECK_MSG(res->push_ok[v] && res->right[v], "version %llu: pushed %d, right %d",
                  (unsigned long long)v, res->push_ok[v], res->right[v]);
        CHECK(st->base_version == v - 1);
        CHECK_MSG(st->bytes_plain == (v < 10 ? PLAIN : 0), "version %llu: %llu bytes plain",
                  (unsigned long long)v, (unsigned long long)st->bytes_plain);
        CHECK_MSG(st->bytes_encoded > 0 && st->bytes_encoded < (v < 10 ? PLAIN : 2 * PLAIN) / 10,
                  "version %llu: %llu bytes encoded", (unsigned long long)v,
                  (unsigned long long)st->bytes_encoded);
    }
}

/* A sender's params with the cut-off (and the variable): refused before anything starts. */
static void refused(double cutoff, const char *env, const char *needle)
{
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;

    if (env != NULL)
        setenv("WSYNC_DELTA_CUTOFF", env, 1);
    else
        unsetenv("WSYNC_DELTA_CUTOFF");
    sp.coordinator = "127.0.0.1:1";
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = 1;
    sp.delta_cutoff = cutoff;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    CHECK_ST(wsync_sender_create(ctx, &sp, &s), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("delta_cutoff");
    CHECK_ERR_HAS(needle);
    CHECK(s == NULL);
    wsync_ctx_free(ctx);
    unsetenv("WSYNC_DELTA_CUTOFF");
}

static void case_refused(void)
{
    refused(-0.5, NULL, "-0.5");
    refused(1.5, NULL, "1.5");
    refused(NAN, NULL, "nan");
    refused(0.0, "0", "WSYNC_DELTA_CUTOFF='0'");
    refused(0.0, "-1", "WSYNC_DELTA_CUTOFF='-1'");
    refused(0.0, "1.01", "WSYNC_DELTA_CUTOFF='1.01'");
    refused(0.0, "nan", "WSYNC_DELTA_CUTOFF='nan'");
    refused(0.0, "0.5x", "WSYNC_DELTA_CUTOFF='0.5x'");
    /* the param, when set, wins over the variable: a bad param is refused whatever it says */
    refused(2.0, "0.5", "= 2");
}

int main(void)
{
    RUN(case_refused);
    RUN(case_default);
    RUN(case_param_one);
    RUN(case_env_one);
    RUN(case_reprobe);
    return check_summary();
}
