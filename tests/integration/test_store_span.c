/* The store's reads of column slices (TP's row-parallel slices of FSDP's row shards): rows whose
 * gap is at most WSYNC_STORE_GAP_KB are read as spans, gaps included, and scattered; the others
 * one get per row (schemes/store.c, schemes/store_stage.c). Two senders hold the row halves of
 * each param, two readers take column ranges of every row, and every target byte must equal the
 * weights' formula (bf16, or its fp32 value for a target that casts). The params sit on the
 * edges: a gap of exactly the limit and one element over it, one row per sender, rows longer
 * than a staging slot, uneven ranges (one reader's rows spanned, the other's not), a reader whose
 * last span ends where the shard (in place: its registered region) ends. Run over host targets
 * (spans through a memcpy slot), the staged ring (WSYNC_STORE_STAGE=1), the rule off (gap 0),
 * snapshots and in place, on each RMA transport; the spans must take fewer gets than rows do
 * (counted from the reader's debug line). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "tests/support/transports.h"
#include "wsync/wsync.h"

#define NSENDERS 2
#define NRECV 2
#define VERSIONS 2
#define TIMEOUT_MS 20000

typedef struct {
    const char *name;
    int64_t rows, cols;
    int64_t split;                   /* reader 0 takes columns [0, split), reader 1 the rest */
    int cast;                        /* the readers' targets are fp32 */
} span_param_t;

/* gap limit 1 KiB in every run that spans, staging slots of 4 KiB */
static const span_param_t params[] = {
    {"at", 16, 1024, 512, 0},        /* 1024-byte rows, gap 1024: spans */
    {"over", 16, 1026, 513, 0},      /* 1026-byte rows, gap 1026: one get per row */
    {"one", 2, 600, 300, 0},         /* one row per sender */
    {"long", 6, 2200, 2100, 0},      /* reader 0: 4200-byte rows (> a slot), gap 200 */
    {"odd", 10, 700, 650, 0},        /* reader 0: gap 100, spans; reader 1: gap 1300, rows */
    {"cast", 16, 1024, 512, 1},      /* a span into the bounce buffer, cast to fp32 */
};
enum { NPARAMS = sizeof(params) / sizeof(params[0]) };

typedef struct {
    const char *transport;
    int in_place;
    const char *gap_kb;              /* WSYNC_STORE_GAP_KB */
    int stage_all;                   /* WSYNC_STORE_STAGE=1 */
} run_t;

/* what the readers tell the parent (a shared page) */
typedef struct {
    uint64_t gets[NRECV];            /* gets of version 1, from the debug line; 0: not seen */
    int bad[NRECV];                  /* targets whose bytes differ */
} shared_t;

static char coord_addr[64];
static const run_t *cur;
static shared_t *shared;
static int quit_pipe[NSENDERS][2];

/* element i (row-major, global) of param p at version v, as bf16 bits: finite values only, so
 * that the fp32 cast is exact */
static uint16_t value(int p, uint64_t v, size_t i)
{
    uint64_t x = ((uint64_t)p << 56) ^ (v << 40) ^ i;
    x = (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9ull;
    uint16_t b = (uint16_t)(x >> 48);
    return (uint16_t)(b & 0xBFFF);   /* exponent below all-ones: never Inf or NaN */
}

static void set_env(void)
{
    setenv("WSYNC_STORE_TRANSPORT", cur->transport, 1);
    setenv("WSYNC_STORE_GAP_KB", cur->gap_kb, 1);
    setenv("WSYNC_STORE_STAGE_KB", "4", 1);
    if (cur->stage_all)
        setenv("WSYNC_STORE_STAGE", "1", 1);
    else
        unsetenv("WSYNC_STORE_STAGE");
}

static int sender_main(void *arg)
{
    int rank = (int)(intptr_t)arg;
    wsync_ctx_t *ctx;
    wsync_sender_t *s;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint16_t *w[NPARAMS];

    set_env();
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = rank;
    sp.nranks = NSENDERS;
    sp.nreceivers = NRECV;
    sp.scheme = "store";
    sp.keep_versions = VERSIONS;
    sp.snapshot = !cur->in_place;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    if (wsync_sender_create(ctx, &sp, &s) != WSYNC_OK) {
        CHECK_OK(WSYNC_ERR_INTERNAL);
        return 1;
    }
    for (int p = 0; p < NPARAMS; p++) {
        const span_param_t *q = &params[p];
        int64_t half = q->rows / NSENDERS;
        w[p] = malloc((size_t)(half * q->cols) * 2);
        wsync_shard_t sh = {{q->name, WSYNC_DTYPE_BF16, 2, {q->rows, q->cols}},
                            {{rank * half, 0}, {half, q->cols}}, w[p], WSYNC_MEM_HOST, 0};
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    /* in place, the readers read the shards themselves: one version only */
    int versions = cur->in_place ? 1 : VERSIONS;
    for (uint64_t v = 1; v <= (uint64_t)versions; v++) {
        for (int p = 0; p < NPARAMS; p++) {
            size_t n = (size_t)(params[p].rows / NSENDERS * params[p].cols);
            for (size_t i = 0; i < n; i++)
                w[p][i] = value(p, v, (size_t)rank * n + i);
        }
        CHECK_OK(wsync_sender_push(s, v));
        if (!cur->in_place)          /* the trainer steps on: the snapshot must not see it */
            for (int p = 0; p < NPARAMS; p++)
                memset(w[p], 0x5a, (size_t)(params[p].rows / NSENDERS * params[p].cols) * 2);
    }
    char c;
    if (read(quit_pipe[rank][0], &c, 1) != 1)     /* the store lives here until readers are done */
        CHECK_MSG(0, "sender %d: no word from the parent", rank);
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    for (int p = 0; p < NPARAMS; p++)
        free(w[p]);
    return check_failures ? 1 : 0;
}

static float bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* The first "read version 1 in N gets" of the reader's debug log. */
static uint64_t gets_logged(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[512];
    unsigned long long n = 0;

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        const char *m = strstr(line, "read version 1 in ");
        if (m != NULL && sscanf(m, "read version 1 in %llu gets", &n) == 1)
            break;
    }
    if (f != NULL)
        fclose(f);
    return n;
}

static int receiver_main(void *arg)
{
    int rank = (int)(intptr_t)arg;
    wsync_ctx_t *ctx;
    wsync_receiver_t *rv;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_piece_t pieces[NPARAMS];
    void *buf[NPARAMS];
    char log_path[96];

    set_env();
    /* the reader's debug line says how many gets it made */
    snprintf(log_path, sizeof(log_path), "/tmp/test_store_span.%d.log", (int)getpid());
    if (freopen(log_path, "w", stderr) == NULL)
        return 1;
    setenv("WSYNC_LOG_LEVEL", "debug", 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = rank;
    rp.nreceivers = NRECV;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    if (wsync_receiver_create(ctx, &rp, &rv) != WSYNC_OK) {
        CHECK_OK(WSYNC_ERR_INTERNAL);
        return 1;
    }
    for (int p = 0; p < NPARAMS; p++) {
        const span_param_t *q = &params[p];
        int64_t c0 = rank == 0 ? 0 : q->split, n = rank == 0 ? q->split : q->cols - q->split;
        size_t esz = q->cast ? 4 : 2;
        buf[p] = malloc((size_t)(q->rows * n) * esz);
        pieces[p] = (wsync_piece_t){{q->name, WSYNC_DTYPE_BF16, 2, {q->rows, q->cols}},
                                    {{0, c0}, {q->rows, n}}, {0, 0}};
        wsync_target_t t = {q->name, q->cast ? WSYNC_DTYPE_F32 : WSYNC_DTYPE_BF16, 2,
                            {q->rows, n}, buf[p], WSYNC_MEM_HOST, 0, &pieces[p], 1, {0}};
        CHECK_OK(wsync_receiver_add_target(rv, &t));
    }
    int versions = cur->in_place ? 1 : VERSIONS;
    for (uint64_t v = 1; v <= (uint64_t)versions; v++) {
        uint64_t got = 0;
        wsync_status_t st = wsync_receiver_fetch(rv, v, TIMEOUT_MS, &got);
        CHECK_MSG(st == WSYNC_OK && got == v, "reader %d: fetch of version %llu: %s", rank,
                  (unsigned long long)v, st == WSYNC_OK ? "another version" : wsync_last_error());
        for (int p = 0; p < NPARAMS && st == WSYNC_OK; p++) {
            const span_param_t *q = &params[p];
            int64_t c0 = rank == 0 ? 0 : q->split, n = rank == 0 ? q->split : q->cols - q->split;
            int same = 1;
            for (int64_t i = 0; i < q->rows && same; i++)
                for (int64_t j = 0; j < n && same; j++) {
                    uint16_t want = value(p, v, (size_t)(i * q->cols + c0 + j));
                    if (q->cast)
                        same = ((float *)buf[p])[i * n + j] == bf16_to_f32(want);
                    else
                        same = ((uint16_t *)buf[p])[i * n + j] == want;
                }
            if (!same) {
                shared->bad[rank]++;
                CHECK_MSG(0, "reader %d, version %llu: param '%s' (columns %lld + %lld) differs",
                          rank, (unsigned long long)v, q->name, (long long)c0, (long long)n);
            }
        }
    }
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    fflush(stderr);
    shared->gets[rank] = gets_logged(log_path);
    if (check_failures == 0)
        unlink(log_path);
    for (int p = 0; p < NPARAMS; p++)
        free(buf[p]);
    return check_failures ? 1 : 0;
}

/* One group: both senders, both readers; the readers' gets of version 1 into gets[]. */
static void run_group(const run_t *run, uint64_t *gets)
{
    pid_t senders[NSENDERS], readers[NRECV];
    int codes[NSENDERS > NRECV ? NSENDERS : NRECV];

    cur = run;
    memset(shared, 0, sizeof(*shared));
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    for (int s = 0; s < NSENDERS; s++) {
        if (pipe(quit_pipe[s]) != 0)
            abort();
        senders[s] = proc_spawn(sender_main, (void *)(intptr_t)s, 120);
    }
    for (int r = 0; r < NRECV; r++)
        readers[r] = proc_spawn(receiver_main, (void *)(intptr_t)r, 120);
    proc_wait_all(readers, NRECV, 90000, codes);
    for (int r = 0; r < NRECV; r++)
        CHECK_MSG(codes[r] == 0 && shared->bad[r] == 0, "%s, %s, gap %s KiB%s: reader %d exited "
                  "with %d, %d targets wrong (its log: /tmp/test_store_span.%d.log)",
                  run->transport, run->in_place ? "in place" : "snapshots", run->gap_kb,
                  run->stage_all ? ", staged" : "", r, codes[r], shared->bad[r], (int)readers[r]);
    for (int s = 0; s < NSENDERS; s++) {
        if (write(quit_pipe[s][1], "q", 1) != 1)
            abort();
        close(quit_pipe[s][1]);
    }
    proc_wait_all(senders, NSENDERS, 60000, codes);
    for (int s = 0; s < NSENDERS; s++) {
        CHECK_MSG(codes[s] == 0, "sender %d exited with %d", s, codes[s]);
        close(quit_pipe[s][0]);
    }
    for (int r = 0; r < NRECV; r++) {
        gets[r] = shared->gets[r];
        CHECK_MSG(gets[r] > 0, "reader %d logged no 'read version 1 in N gets' line", r);
    }
}

static void run_all(const char *t)
{
    uint64_t rows[NRECV], spans[NRECV], g[NRECV];

    if (!test_have_transport(t))
        return;
    run_t off = {t, 0, "0", 0}, on = {t, 0, "1", 0};
    run_group(&off, rows);
    run_group(&on, spans);
    for (int r = 0; r < NRECV; r++)
        CHECK_MSG(spans[r] < rows[r], "%s reader %d: %llu gets with spans, %llu row by row: "
                  "nothing was spanned", t, r, (unsigned long long)spans[r],
                  (unsigned long long)rows[r]);
    run_t in_place = {t, 1, "1", 0}, staged = {t, 0, "1", 1}, staged_in_place = {t, 1, "1", 1};
    run_group(&in_place, g);
    run_group(&staged, g);
    run_group(&staged_in_place, g);
}

static void case_span_ucx(void) { run_all("ucx"); }
static void case_span_ofi(void) { run_all("ofi"); }

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    shared = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                  0);
    if (shared == MAP_FAILED)
        return 1;
    RUN(case_span_ucx);
    RUN(case_span_ofi);
    return check_summary();
}
