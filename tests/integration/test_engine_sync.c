/* The engine as a wsync receiver: two trainer processes hold the tiny Qwen3 FSDP-2 and push
 * versions (w_v = bf16(w * (1 + v/8) + v/1024)); TP ranks of the engine take them through the
 * public API. Checked against references the test builds itself (an engine loaded from the
 * version's full tensors, no wsync involved):
 *  - in place, TP 2, bf16 and FP8 block (32 x 32): after each update every target of every rank
 *    equals, byte for byte (scales too), the reference's; the tokens are the reference's;
 *  - shadow, TP 2: the engine keeps generating (slowly, through a token callback) while the
 *    versions land in spare buffers; every token of a generation sees the same per-version
 *    signature in the weights (model.norm.weight[0] identifies v), that is the version the
 *    generation reports, and its tokens are that version's; some version landed mid-generation;
 *  - sleep and wake, in place and shadow: level 1 frees the KV cache (generation refused, then
 *    the same tokens after wake); level 2 frees the weights (refused until the next version),
 *    and the next version lands in the new buffers (re-pointed targets) exactly;
 *  - a lost trainer: every rank's update fails naming the lost peer, within the deadline. */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/proc.h"

#define MODEL_DIR WSYNC_TESTDATA "/hf_qwen3_tiny"
#define CKPT MODEL_DIR "/model.safetensors"
#define NSENDERS 2
#define TIMEOUT_MS 20000
#define MAXV 8
#define NEW 12

enum { PLAIN, SHADOW_OVERLAP, SLEEP_WAKE, TRAINER_DIES };

typedef struct {
    int scenario;
    int tp;
    int shadow;
    int fp8;
    int vocab_pad;
    int versions;
    int rank;       /* of a trainer */
} group_t;

static char coord[64];
/* engine ranks asleep at level 2; the trainers push version 2 only then (SLEEP_WAKE) */
static _Atomic int *asleep;
/* trainers done pushing: they leave together (sender 0 is the coordinator) */
static _Atomic int *finished;
static const int32_t prompt[] = {3, 141, 59, 26, 53, 58, 97, 93, 23, 84};
#define NPROMPT ((int)(sizeof(prompt) / sizeof(prompt[0])))

/* ---- versions of the checkpoint ------------------------------------------------------------ */

static float bf16f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t version_value(uint16_t w, int v)
{
    return to_bf16((float)(bf16f(w) * (1.0 + v / 8.0) + v / 1024.0));
}

typedef struct {
    wsync_engine_st_t *ckpt;
    wsync_engine_tensor_t *t;   /* version v of every tensor */
    uint16_t *data;
    size_t n;
} version_t;

static int version_make(version_t *vt, int v)
{
    const wsync_engine_tensor_t *src;
    size_t total = 0, off = 0;

    memset(vt, 0, sizeof(*vt));
    if (wsync_engine_st_open(CKPT, &vt->ckpt) != WSYNC_OK) {
        CHECK_MSG(0, "%s", wsync_engine_last_error());
        return -1;
    }
    src = wsync_engine_st_tensors(vt->ckpt);
    vt->n = wsync_engine_st_count(vt->ckpt);
    for (size_t i = 0; i < vt->n; i++)
        total += src[i].nbytes / 2;
    vt->t = calloc(vt->n, sizeof(*vt->t));
    vt->data = malloc(total * 2);
    for (size_t i = 0; i < vt->n; i++) {
        size_t k = src[i].nbytes / 2;
        vt->t[i] = src[i];
        for (size_t e = 0; e < k; e++) {
            uint16_t w;
            memcpy(&w, (const uint8_t *)src[i].data + 2 * e, 2);
            vt->data[off + e] = version_value(w, v);
        }
        vt->t[i].data = vt->data + off;
        off += k;
    }
    return 0;
}

static void version_free(version_t *vt)
{
    free(vt->t);
    free(vt->data);
    wsync_engine_st_close(vt->ckpt);
}

/* ---- trainers ---------------------------------------------------------------------------- */

static int trainer_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank;
    wsync_model_config_t cfg;
    wsync_shard_t *shards = NULL;
    size_t nshards = 0;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_engine_st_t *ckpt = NULL;
    uint8_t *mem = NULL;
    wsync_status_t st;
    int scenario = g->scenario, versions = g->versions;

    CHECK_OK(wsync_model_config_load(MODEL_DIR "/config.json", &cfg));
    CHECK(wsync_engine_st_open(CKPT, &ckpt) == WSYNC_OK);
    CHECK_OK(wsync_layout_fsdp_shards(&cfg, WSYNC_DTYPE_BF16, rank, NSENDERS, &shards, &nshards));
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    if (check_failures)
        goto out;
    sp.coordinator = coord;
    sp.rank = rank;
    sp.nranks = NSENDERS;
    sp.nreceivers = g->tp;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 100;
    st = wsync_sender_create(ctx, &sp, &s);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        goto out;
    {
        size_t total = 0;
        for (size_t i = 0; i < nshards; i++)
            total += (size_t)wsync_engine_st_find(ckpt, shards[i].param.name)->nbytes;
        CHECK_OK(wsync_mem_alloc(ctx, total, (void **)&mem));
        size_t off = 0;
        for (size_t i = 0; i < nshards && mem != NULL; i++) {
            const wsync_engine_tensor_t *t = wsync_engine_st_find(ckpt, shards[i].param.name);
            int64_t row = t->ndim > 1 ? t->shape[1] : 1;
            shards[i].data = mem + off + (size_t)(shards[i].box.start[0] * row) * 2;
            off += t->nbytes;
            CHECK_OK(wsync_sender_add_shard(s, &shards[i]));
        }
    }
    if (check_failures)
        goto out;
    for (int v = 1; v <= versions; v++) {
        size_t off = 0;
        for (size_t i = 0; i < nshards; i++) {
            const wsync_engine_tensor_t *t = wsync_engine_st_find(ckpt, shards[i].param.name);
            int64_t row = t->ndim > 1 ? t->shape[1] : 1;
            int64_t e0 = shards[i].box.start[0] * row, e1 = e0 + shards[i].box.len[0] * row;
            for (int64_t e = e0; e < e1; e++) {
                uint16_t w;
                memcpy(&w, (const uint8_t *)t->data + 2 * e, 2);
                w = version_value(w, v);
                memcpy(mem + off + 2 * e, &w, 2);
            }
            off += t->nbytes;
        }
        if (scenario == TRAINER_DIES && v == 2 && rank == 1)
            _exit(9);   /* in the middle of the group's life */
        if (scenario == SLEEP_WAKE && v == 2) {
            long long deadline = proc_now_ms() + TIMEOUT_MS;
            while (atomic_load(asleep) < g->tp && proc_now_ms() < deadline)
                usleep(1000);
            CHECK(atomic_load(asleep) == g->tp);
        }
        st = wsync_sender_push(s, (uint64_t)v);
        if (scenario == TRAINER_DIES && v == 2) {
            CHECK(st != WSYNC_OK);
            break;
        }
        CHECK_MSG(st == WSYNC_OK, "trainer %d: push %d: %s", rank, v, wsync_last_error());
        if (st != WSYNC_OK)
            break;
    }
out:
    atomic_fetch_add(finished, 1);
    if (scenario != TRAINER_DIES) {
        long long deadline = proc_now_ms() + TIMEOUT_MS;
        while (atomic_load(finished) < NSENDERS && proc_now_ms() < deadline)
            usleep(1000);
    }
    wsync_sender_free(s);
    if (mem != NULL)
        wsync_mem_free(ctx, mem);
    wsync_ctx_free(ctx);
    wsync_layout_shards_free(shards, nshards);
    wsync_engine_st_close(ckpt);
    return check_failures ? 1 : 0;
}

/* ---- references ---------------------------------------------------------------------------- */

static wsync_engine_params_t params_of(const group_t *g, int rank, wsync_engine_comm_t *comm)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    p.tp_rank = rank;
    p.tp_size = g->tp;
    p.comm = comm;
    p.vocab_pad = g->vocab_pad;
    p.mode = g->shadow ? WSYNC_ENGINE_SHADOW : WSYNC_ENGINE_IN_PLACE;
    if (g->fp8) {
        p.quant = WSYNC_ENGINE_QUANT_FP8_BLOCK;
        p.fp8_block = 32;
    }
    return p;
}

/* Tokens of version v from a single-process engine holding the full weights. */
static void ref_tokens(const group_t *g, int v, int32_t *out)
{
    version_t vt;
    wsync_engine_params_t p = params_of(g, 0, NULL);
    wsync_model_config_t cfg;
    wsync_engine_t *e = NULL;

    p.tp_size = 1;
    p.mode = WSYNC_ENGINE_IN_PLACE;
    CHECK_OK(wsync_model_config_load(MODEL_DIR "/config.json", &cfg));
    if (version_make(&vt, v) != 0)
        return;
    CHECK(wsync_engine_create(&cfg, &p, &e) == WSYNC_OK);
    CHECK_MSG(wsync_engine_load(e, vt.t, vt.n) == WSYNC_OK, "%s", wsync_engine_last_error());
    CHECK(wsync_engine_generate(e, prompt, NPROMPT, NEW, out, NULL) == WSYNC_OK);
    wsync_engine_free(e);
    version_free(&vt);
}

/* Every target of rank `rank` equals, bytes and scales, that of an engine loaded from the full
 * tensors of version v. */
static void check_weights(const group_t *g, wsync_engine_t *e, int rank, int v)
{
    version_t vt;
    wsync_engine_comm_t *dummy = NULL;
    wsync_engine_params_t p;
    wsync_model_config_t cfg;
    wsync_engine_t *ref = NULL;

    CHECK_OK(wsync_model_config_load(MODEL_DIR "/config.json", &cfg));
    if (version_make(&vt, v) != 0)
        return;
    if (g->tp > 1)
        CHECK(wsync_engine_comm_create(g->tp, &cfg, g->vocab_pad, 1000, &dummy) == WSYNC_OK);
    p = params_of(g, rank, dummy);
    p.mode = WSYNC_ENGINE_IN_PLACE;
    CHECK(wsync_engine_create(&cfg, &p, &ref) == WSYNC_OK);
    CHECK_MSG(wsync_engine_load(ref, vt.t, vt.n) == WSYNC_OK, "%s", wsync_engine_last_error());
    CHECK(wsync_engine_weight_count(ref) == wsync_engine_weight_count(e));
    for (size_t i = 0; ref != NULL && i < wsync_engine_weight_count(e); i++) {
        wsync_engine_weight_t a, b;
        CHECK_OK(wsync_engine_weight(e, i, &a));
        CHECK_OK(wsync_engine_weight(ref, i, &b));
        CHECK(strcmp(a.name, b.name) == 0 && a.bytes == b.bytes && a.nscales == b.nscales);
        CHECK_MSG(memcmp(a.data, b.data, a.bytes) == 0, "rank %d version %d: %s differs from "
                  "the reference", rank, v, a.name);
        if (a.nscales)
            CHECK_MSG(memcmp(a.scales, b.scales, a.nscales * sizeof(float)) == 0,
                      "rank %d version %d: scales of %s differ", rank, v, a.name);
    }
    wsync_engine_free(ref);
    wsync_engine_comm_free(dummy);
    version_free(&vt);
}

/* model.norm.weight[0] tells which version the weights in use are */
static uint16_t signature[MAXV + 1];

static void make_signatures(void)
{
    wsync_engine_st_t *ckpt = NULL;
    uint16_t w0;
    CHECK(wsync_engine_st_open(CKPT, &ckpt) == WSYNC_OK);
    memcpy(&w0, wsync_engine_st_find(ckpt, "model.norm.weight")->data, 2);
    for (int v = 0; v <= MAXV; v++) {
        signature[v] = version_value(w0, v);
        for (int k = 0; k < v; k++)
            CHECK(signature[k] != signature[v]);
    }
    wsync_engine_st_close(ckpt);
}

static int signature_version(wsync_engine_t *e)
{
    for (size_t i = 0; i < wsync_engine_weight_count(e); i++) {
        wsync_engine_weight_t w;
        if (wsync_engine_weight(e, i, &w) != WSYNC_OK || strcmp(w.name, "model.norm.weight") != 0)
            continue;
        uint16_t b;
        memcpy(&b, w.data, 2);
        for (int v = 0; v <= MAXV; v++)
            if (signature[v] == b)
                return v;
    }
    return -1;
}

/* ---- engine ranks ------------------------------------------------------------------------- */

typedef struct {
    wsync_engine_t *e;
    int sig[NEW];           /* signature seen at each token */
    int landed_during;      /* a version was pending at some token */
} watch_t;

static int on_token(void *arg, int index, int32_t token)
{
    watch_t *w = arg;
    (void)token;
    w->sig[index] = signature_version(w->e);
    if (wsync_engine_pending(w->e))
        w->landed_during = 1;
    usleep(4000);   /* a slow generation, so that versions land during it */
    return 0;
}

static void check_tokens(const group_t *g, int rank, int v, const int32_t *got)
{
    int32_t want[NEW];
    ref_tokens(g, v, want);
    for (int i = 0; i < NEW; i++)
        if (got[i] != want[i]) {
            CHECK_MSG(0, "rank %d version %d: token %d is %d, the reference says %d", rank, v, i,
                      got[i], want[i]);
            break;
        }
}

static int engine_rank(int rank, int tp, wsync_engine_comm_t *comm, void *arg)
{
    const group_t *g = arg;
    wsync_engine_params_t p = params_of(g, rank, comm);
    wsync_engine_t *e = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_engine_result_t res;
    int32_t out[NEW], before[NEW];
    uint64_t v = 0;
    wsync_status_t st;

    (void)tp;
    make_signatures();
    CHECK_MSG(wsync_engine_open(MODEL_DIR, &p, &e) == WSYNC_OK, "%s", wsync_engine_last_error());
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    if (e == NULL || ctx == NULL)
        goto out;
    rp.coordinator = coord;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 100;
    st = wsync_engine_attach(e, ctx, &rp);
    CHECK_MSG(st == WSYNC_OK, "rank %d: %s", rank, wsync_engine_last_error());
    if (st != WSYNC_OK)
        goto out;
    CHECK(wsync_engine_version(e) == 0 && signature_version(e) == 0);

    switch (g->scenario) {
    case PLAIN:
        for (int k = 1; k <= g->versions; k++) {
            st = wsync_engine_update(e, TIMEOUT_MS, &v);
            CHECK_MSG(st == WSYNC_OK, "rank %d: update: %s", rank, wsync_engine_last_error());
            if (st != WSYNC_OK)
                break;
            CHECK_MSG(v == (uint64_t)k && wsync_engine_version(e) == v, "rank %d got version %llu,"
                      " expected %d", rank, (unsigned long long)v, k);
            check_weights(g, e, rank, k);
            CHECK(wsync_engine_generate(e, prompt, NPROMPT, NEW, out, &res) == WSYNC_OK);
            CHECK(res.version == (uint64_t)k);
            check_tokens(g, rank, k, out);
        }
        break;

    case SHADOW_OVERLAP: {
        watch_t w;
        int gens = 0, overlaps = 0, seen_last = 0;
        long long deadline = proc_now_ms() + 60000;
        memset(&w, 0, sizeof(w));
        w.e = e;
        wsync_engine_set_token_callback(e, on_token, &w);
        while (!seen_last && proc_now_ms() < deadline) {
            memset(w.sig, -1, sizeof(w.sig));
            w.landed_during = 0;
            st = wsync_engine_generate(e, prompt, NPROMPT, NEW, out, &res);
            CHECK_MSG(st == WSYNC_OK, "rank %d: %s", rank, wsync_engine_last_error());
            if (st != WSYNC_OK)
                break;
            gens++;
            overlaps += w.landed_during;
            for (int i = 0; i < NEW; i++)
                CHECK_MSG(w.sig[i] == (int)res.version, "rank %d: generation %d reported version "
                          "%llu but token %d saw the weights of version %d", rank, gens,
                          (unsigned long long)res.version, i, w.sig[i]);
            check_tokens(g, rank, (int)res.version, out);
            seen_last = res.version == (uint64_t)g->versions;
        }
        CHECK_MSG(seen_last, "rank %d never served version %d", rank, g->versions);
        CHECK_MSG(overlaps > 0, "rank %d: no version landed during a generation (%d generations)",
                  rank, gens);
        fprintf(stderr, "rank %d: %d generations, %d with a version landing meanwhile\n", rank,
                gens, overlaps);
        check_weights(g, e, rank, g->versions);
        break;
    }

    case SLEEP_WAKE:
        CHECK(wsync_engine_update(e, TIMEOUT_MS, &v) == WSYNC_OK && v == 1);
        CHECK(wsync_engine_generate(e, prompt, NPROMPT, NEW, before, NULL) == WSYNC_OK);
        check_tokens(g, rank, 1, before);
        /* level 1: no KV cache, weights kept */
        CHECK_OK(wsync_engine_sleep(e, 1));
        CHECK(wsync_engine_sleeping(e) == 1);
        CHECK(wsync_engine_generate(e, prompt, NPROMPT, NEW, out, NULL) == WSYNC_ERR_STATE);
        CHECK_MSG(strstr(wsync_engine_last_error(), "asleep") != NULL, "%s",
                  wsync_engine_last_error());
        CHECK_OK(wsync_engine_wake(e));
        CHECK(wsync_engine_generate(e, prompt, NPROMPT, NEW, out, &res) == WSYNC_OK);
        CHECK(res.version == 1 && memcmp(out, before, sizeof(out)) == 0);
        /* level 2: the weights go too; version 2 lands in the new buffers */
        CHECK_OK(wsync_engine_sleep(e, 2));
        CHECK(wsync_engine_weight(e, 0, &(wsync_engine_weight_t){0}) == WSYNC_ERR_STATE);
        CHECK(wsync_engine_update(e, 100, &v) == WSYNC_ERR_STATE);
        atomic_fetch_add(asleep, 1);
        usleep(200000);   /* the trainers push version 2 meanwhile */
        CHECK_OK(wsync_engine_wake(e));
        CHECK(wsync_engine_generate(e, prompt, NPROMPT, NEW, out, NULL) == WSYNC_ERR_STATE);
        CHECK_MSG(strstr(wsync_engine_last_error(), "no weights") != NULL, "%s",
                  wsync_engine_last_error());
        st = wsync_engine_update(e, TIMEOUT_MS, &v);
        CHECK_MSG(st == WSYNC_OK && v == 2, "rank %d: update after wake: %s (version %llu)", rank,
                  wsync_engine_last_error(), (unsigned long long)v);
        check_weights(g, e, rank, 2);
        CHECK(wsync_engine_generate(e, prompt, NPROMPT, NEW, out, &res) == WSYNC_OK);
        /* in shadow mode version 3 may have landed meanwhile; generate then swaps it in */
        CHECK_MSG(res.version == 2 || (g->shadow && res.version == 3), "version %llu",
                  (unsigned long long)res.version);
        check_tokens(g, rank, (int)res.version, out);
        /* and a third version, as usual */
        if (wsync_engine_version(e) < 3)
            CHECK(wsync_engine_update(e, TIMEOUT_MS, &v) == WSYNC_OK && v == 3);
        check_weights(g, e, rank, 3);
        break;

    case TRAINER_DIES: {
        long long t0;
        CHECK(wsync_engine_update(e, TIMEOUT_MS, &v) == WSYNC_OK && v == 1);
        t0 = proc_now_ms();
        st = wsync_engine_update(e, TIMEOUT_MS, &v);
        CHECK_MSG(st == WSYNC_ERR_PEER_LOST || st == WSYNC_ERR_ABORTED, "rank %d: update "
                  "returned %s (%s)", rank, wsync_status_name(st), wsync_engine_last_error());
        CHECK_MSG(proc_now_ms() - t0 < TIMEOUT_MS, "noticed after %lld ms", proc_now_ms() - t0);
        fprintf(stderr, "rank %d saw: %s\n", rank, wsync_engine_last_error());
        /* the weights of version 1 are still whole and still serve */
        if (!g->shadow)
            check_weights(g, e, rank, 1);
        break;
    }
    }
out:
    wsync_engine_free(e);
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

static int engine_group(void *arg)
{
    const group_t *g = arg;
    wsync_model_config_t cfg;
    wsync_engine_comm_t *comm = NULL;
    int codes[WSYNC_ENGINE_MAX_TP];
    wsync_status_t st;

    CHECK_OK(wsync_model_config_load(MODEL_DIR "/config.json", &cfg));
    if (g->tp > 1)
        CHECK(wsync_engine_comm_create(g->tp, &cfg, g->vocab_pad, TIMEOUT_MS + 10000, &comm) ==
              WSYNC_OK);
    st = wsync_engine_launch(g->tp, comm, engine_rank, (void *)g, 100, codes);
    for (int r = 0; r < g->tp; r++)
        CHECK_MSG(codes[r] == 0, "engine rank %d exited with %d", r, codes[r]);
    CHECK_MSG(st == WSYNC_OK, "%s", wsync_engine_last_error());
    wsync_engine_comm_free(comm);
    return check_failures ? 1 : 0;
}

static void run_group(const group_t *g)
{
    pid_t pids[NSENDERS + 1];
    group_t tg[NSENDERS];
    int codes[NSENDERS + 1];

    snprintf(coord, sizeof(coord), "127.0.0.1:%d", proc_free_port());
    atomic_store(asleep, 0);
    atomic_store(finished, 0);
    for (int s = 0; s < NSENDERS; s++) {
        tg[s] = *g;
        tg[s].rank = s;
        pids[s] = proc_spawn(trainer_main, &tg[s], 110);
    }
    pids[NSENDERS] = proc_spawn(engine_group, (void *)g, 110);
    proc_wait_all(pids, NSENDERS + 1, 120000, codes);
    for (int i = 0; i <= NSENDERS; i++) {
        int want = g->scenario == TRAINER_DIES && i == 1 ? 9 : 0;   /* the one that dies */
        CHECK_MSG(codes[i] == want, "%s exited with %d", i < NSENDERS ? "a trainer" : "the engine",
                  codes[i]);
    }
}

static void case_in_place_tp2(void)
{
    run_group(&(group_t){PLAIN, 2, 0, 0, 0, 3, 0});
}

static void case_in_place_tp2_fp8_vocab_padded(void)
{
    run_group(&(group_t){PLAIN, 2, 0, 1, 256, 2, 0});
}

static void case_shadow_tp2_one_version_per_generation(void)
{
    run_group(&(group_t){SHADOW_OVERLAP, 2, 1, 0, 0, 4, 0});
}

static void case_sleep_wake_in_place_tp2(void)
{
    run_group(&(group_t){SLEEP_WAKE, 2, 0, 0, 256, 3, 0});
}

static void case_sleep_wake_shadow_tp1_fp8(void)
{
    run_group(&(group_t){SLEEP_WAKE, 1, 1, 1, 0, 3, 0});
}

static void case_trainer_dies(void)
{
    run_group(&(group_t){TRAINER_DIES, 2, 0, 0, 0, 3, 0});
}

/* wsync-engine --sync: the command line's ranks take the versions the trainers push */
static void case_cli_sync(void)
{
    group_t g = {PLAIN, 2, 0, 0, 0, 2, 0};
    pid_t pids[NSENDERS];
    group_t tg[NSENDERS];
    int codes[NSENDERS], rc;
    char cmd[1024], ids[256] = "";
    static char text[1 << 16];
    int32_t want[NEW];
    size_t n = 0;
    FILE *p;

    snprintf(coord, sizeof(coord), "127.0.0.1:%d", proc_free_port());
    atomic_store(finished, 0);
    for (int s = 0; s < NSENDERS; s++) {
        tg[s] = g;
        tg[s].rank = s;
        pids[s] = proc_spawn(trainer_main, &tg[s], 110);
    }
    for (int i = 0; i < NPROMPT; i++)
        n += (size_t)snprintf(ids + n, sizeof(ids) - n, "%s%d", i ? "," : "", prompt[i]);
    snprintf(cmd, sizeof(cmd), WSYNC_BIN_DIR "/wsync-engine --model " MODEL_DIR " --tp 2 "
             "--prompt-ids %s --max-new %d --sync %s --versions 2 --timeout 20 --json", ids, NEW,
             coord);
    p = popen(cmd, "r");
    n = p != NULL ? fread(text, 1, sizeof(text) - 1, p) : 0;
    text[n] = '\0';
    rc = p != NULL ? pclose(p) : -1;
    CHECK_MSG(rc == 0, "%s: status %d\n%s", cmd, rc, text);
    proc_wait_all(pids, NSENDERS, 60000, codes);
    for (int i = 0; i < NSENDERS; i++)
        CHECK_MSG(codes[i] == 0, "trainer %d exited with %d", i, codes[i]);
    fprintf(stderr, "%s", text);
    /* the last line: the generation after version 2 */
    char *last = text + n;
    while (last > text && last[-1] == '\n')
        *--last = '\0';
    while (last > text && last[-1] != '\n')
        last--;
    CHECK_MSG(strstr(last, "\"version\":2") != NULL, "%s", last);
    ref_tokens(&g, 2, want);
    char list[512] = "\"tokens\":[";
    size_t m = strlen(list);
    for (int i = 0; i < NEW; i++)
        m += (size_t)snprintf(list + m, sizeof(list) - m, "%s%d", i ? "," : "", want[i]);
    snprintf(list + m, sizeof(list) - m, "]");
    CHECK_MSG(strstr(last, list) != NULL, "%s lacks %s", last, list);
    CHECK(strstr(text, "version 1:") != NULL && strstr(text, "version 2:") != NULL);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    asleep = mmap(NULL, 2 * sizeof(*asleep), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                  -1, 0);
    finished = asleep + 1;
    RUN(case_in_place_tp2);
    RUN(case_in_place_tp2_fp8_vocab_padded);
    RUN(case_shadow_tp2_one_version_per_generation);
    RUN(case_sleep_wake_in_place_tp2);
    RUN(case_sleep_wake_shadow_tp1_fp8);
    RUN(case_trainer_dies);
    RUN(case_cli_sync);
    return check_summary();
}
