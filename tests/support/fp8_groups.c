/* fp8_groups: see fp8_groups.h. */
#include "tests/support/fp8_groups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "wsync/wsync_fp8.h"

uint64_t fg_splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint16_t fg_f32_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fg_bf16_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

wsync_param_t fg_bf16_param(const char *name, int64_t rows, int64_t cols)
{
    wsync_param_t p = {name, WSYNC_DTYPE_BF16, cols ? 2 : 1, {0}};
    p.shape[0] = rows;
    if (cols)
        p.shape[1] = cols;
    return p;
}

void fg_param_rows(const fg_pspec_t *p, int s, int n, int64_t *lo, int64_t *hi)
{
    if (p->cols == 0) {
        *lo = 0;
        *hi = s == 0 ? p->rows : 0;
        return;
    }
    *lo = p->rows * s / n;
    *hi = p->rows * (s + 1) / n;
}

void fg_run_group(const void *group, int nsenders, proc_fn sender, int nreceivers,
                  proc_fn receiver)
{
    int n = nsenders + nreceivers;
    fg_member_t *m = calloc((size_t)n, sizeof(*m));
    pid_t *pids = calloc((size_t)n, sizeof(*pids));
    int *codes = calloc((size_t)n, sizeof(*codes));
    char coord[64];

    CHECK(m != NULL && pids != NULL && codes != NULL);
    if (m == NULL || pids == NULL || codes == NULL)
        goto out;
    snprintf(coord, sizeof(coord), "127.0.0.1:%d", proc_free_port());
    for (int i = 0; i < n; i++) {
        m[i].group = group;
        m[i].rank = i < nsenders ? i : i - nsenders;
        m[i].nsenders = nsenders;
        m[i].nreceivers = nreceivers;
        memcpy(m[i].coordinator, coord, sizeof(coord));
        pids[i] = proc_spawn(i < nsenders ? sender : receiver, &m[i], 60);
    }
    proc_wait_all(pids, n, 90000, codes);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "%s %d exited with %d", i < nsenders ? "sender" : "receiver",
                  m[i].rank, codes[i]);
out:
    free(m);
    free(pids);
    free(codes);
}

void *fg_shared(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void fg_sender_params(wsync_sender_params_t *sp, const fg_member_t *m, uint64_t bucket_bytes,
                      int timeout_ms, const char *store, int snapshot)
{
    sp->coordinator = m->coordinator;
    sp->rank = m->rank;
    sp->nranks = m->nsenders;
    sp->nreceivers = m->nreceivers;
    sp->bucket_bytes = bucket_bytes;
    sp->timeout_ms = timeout_ms;
    sp->heartbeat_ms = 200;
    sp->scheme = store != NULL ? "store" : "ipc";
    if (store != NULL) {
        setenv("WSYNC_STORE_TRANSPORT", store, 1);
        sp->snapshot = snapshot;
        sp->keep_versions = 4;
        sp->delta = "off";
    }
}

void fg_receiver_params(wsync_receiver_params_t *rp, const fg_member_t *m, int timeout_ms)
{
    rp->coordinator = m->coordinator;
    rp->rank = m->rank;
    rp->nreceivers = m->nreceivers;
    rp->timeout_ms = timeout_ms;
    rp->heartbeat_ms = 200;
}

/* Adds to snd the host shard of rows [lo, hi) of bf16 param `param` (1-D: elements) and returns
 * its buffer (malloc'd, uninitialized); NULL if the range is empty or on failure (CHECKed). */
static uint16_t *add_rows(wsync_sender_t *snd, wsync_param_t param, int64_t lo, int64_t hi)
{
    int64_t cols = param.ndim == 2 ? param.shape[1] : 1;
    wsync_shard_t sh = {param, {{lo, 0}, {hi - lo, cols}}, NULL, WSYNC_MEM_HOST, 0};
    uint16_t *data;

    if (hi <= lo)
        return NULL;
    data = malloc((size_t)((hi - lo) * cols) * 2);
    CHECK(data != NULL);
    if (data == NULL)
        return NULL;
    sh.data = data;
    CHECK_OK(wsync_sender_add_shard(snd, &sh));
    return data;
}

/* CHECKs that receiver r's target `name` holds after version v the n bytes `want` and the ns
 * scales `want_s`, naming the first byte or scale that differs. */
static void check_target(int r, uint64_t v, const char *name, const uint8_t *have,
                     const uint8_t *want, size_t n, const float *have_s, const float *want_s,
                     size_t ns)
{
    size_t bad = 0, bad_s = 0;

    while (bad < n && have[bad] == want[bad])
        bad++;
    CHECK_MSG(bad == n, "receiver %d version %llu target %s: byte %zu is %02x, the reference's "
              "%02x", r, (unsigned long long)v, name, bad, bad < n ? have[bad] : 0,
              bad < n ? want[bad] : 0);
    /* bit for bit, as the hashes of what the receivers hold compare them */
    while (bad_s < ns && memcmp(&have_s[bad_s], &want_s[bad_s], sizeof(float)) == 0)
        bad_s++;
    CHECK_MSG(bad_s == ns, "receiver %d version %llu target %s: scale %zu is %a, the "
              "reference's %a", r, (unsigned long long)v, name, bad_s,
              bad_s < ns ? (double)have_s[bad_s] : 0.0, bad_s < ns ? (double)want_s[bad_s] : 0.0);
}

int fg_sender_open(fg_sender_t *fs, const fg_member_t *m, const wsync_sender_params_t *sp,
                   const fg_pspec_t *params, int nparams, fg_value_fn value)
{
    int failures = check_failures;

    memset(fs, 0, sizeof(*fs));
    fs->rank = m->rank;
    fs->nsenders = m->nsenders;
    fs->params = params;
    fs->nparams = nparams;
    fs->value = value;
    CHECK(nparams <= FG_MAX_PARAMS);
    if (nparams > FG_MAX_PARAMS)
        return -1;
    CHECK_OK(wsync_ctx_create(NULL, &fs->ctx));
    if (fs->ctx != NULL)
        CHECK_OK(wsync_sender_create(fs->ctx, sp, &fs->snd));
    for (int p = 0; p < nparams && fs->snd != NULL; p++) {
        int64_t lo, hi;
        fg_param_rows(&params[p], fs->rank, fs->nsenders, &lo, &hi);
        fs->data[p] = add_rows(fs->snd, fg_bf16_param(params[p].name, params[p].rows,
                                                      params[p].cols), lo, hi);
        if (fs->data[p] == NULL && hi > lo)
            break;
    }
    if (check_failures == failures)
        return 0;
    fg_sender_close(fs, 0);
    return -1;
}

void fg_sender_fill(fg_sender_t *fs, uint64_t v)
{
    for (int p = 0; p < fs->nparams; p++) {
        const fg_pspec_t *ps = &fs->params[p];
        int64_t lo, hi, cols = ps->cols ? ps->cols : 1;
        fg_param_rows(ps, fs->rank, fs->nsenders, &lo, &hi);
        for (int64_t i = lo; i < hi && fs->data[p] != NULL; i++)
            for (int64_t j = 0; j < cols; j++)
                fs->data[p][(i - lo) * cols + j] =
                    ps->cols ? fs->value(p, i, j, v) : fs->value(p, 0, i, v);
    }
}

wsync_status_t fg_push_noted(fg_sender_t *fs, uint64_t v, int *status, char *text, size_t len,
                             long long *fail_ms)
{
    long long t0 = proc_now_ms();
    wsync_status_t st = wsync_sender_push(fs->snd, v);

    if (st != WSYNC_OK) {
        *status = (int)st;
        snprintf(text, len, "%s", wsync_last_error());
        if (fail_ms != NULL)
            *fail_ms = proc_now_ms() - t0;
    }
    return st;
}

int fg_sender_close(fg_sender_t *fs, int linger)
{
    if (linger && fs->rank == 0)
        usleep(1000000);
    wsync_sender_free(fs->snd);
    for (int p = 0; p < fs->nparams && p < FG_MAX_PARAMS; p++)
        free(fs->data[p]);
    wsync_ctx_free(fs->ctx);
    memset(fs, 0, sizeof(*fs));
    return check_failures ? 1 : 0;
}

int fg_explains(wsync_sender_t *snd, const char *text)
{
    const char *e = wsync_sender_explain(snd);
    return e != NULL && strstr(e, text) != NULL;
}

wsync_receiver_t *fg_receiver_open(const wsync_receiver_params_t *rp, wsync_ctx_t **ctx)
{
    wsync_receiver_t *rv = NULL;

    *ctx = NULL;
    CHECK_OK(wsync_ctx_create(NULL, ctx));
    if (*ctx != NULL)
        CHECK_OK(wsync_receiver_create(*ctx, rp, &rv));
    if (rv == NULL) {
        wsync_ctx_free(*ctx);
        *ctx = NULL;
    }
    return rv;
}

int fg_target_add(fg_target_t *ft, wsync_receiver_t *rv, wsync_target_t wt)
{
    int64_t rows = wt.shape[0], cols = wt.ndim == 2 ? wt.shape[1] : 1, sr = 0, sc = 0;
    int fp8 = wt.dtype == WSYNC_DTYPE_F8E4M3FN || wt.dtype == WSYNC_DTYPE_F8E5M2;

    memset(ft, 0, sizeof(*ft));
    ft->name = wt.name;
    ft->bytes = (size_t)(rows * cols) * wsync_dtype_size(wt.dtype);
    if (fp8) {
        CHECK_OK(wsync_quant_scales_shape(&wt.quant, rows, cols, &sr, &sc));
        ft->ns = (size_t)(sr * sc);
    }
    ft->buf = malloc(ft->bytes);
    ft->want = malloc(ft->bytes);
    ft->scales = malloc((ft->ns + 1) * sizeof(float));
    ft->want_scales = malloc((ft->ns + 1) * sizeof(float));
    CHECK(ft->buf != NULL && ft->want != NULL && ft->scales != NULL && ft->want_scales != NULL);
    if (ft->buf == NULL || ft->want == NULL || ft->scales == NULL || ft->want_scales == NULL)
        return -1;
    memset(ft->buf, 0xAB, ft->bytes);
    memset(ft->scales, 0xAB, (ft->ns + 1) * sizeof(float));
    wt.data = ft->buf;
    wt.quant.scales = fp8 ? ft->scales : NULL;
    CHECK_OK(wsync_receiver_add_target(rv, &wt));
    return 0;
}

void fg_target_check(const fg_target_t *ft, int r, uint64_t v)
{
    static const uint8_t poison[sizeof(float)] = {0xAB, 0xAB, 0xAB, 0xAB};

    check_target(r, v, ft->name, ft->buf, ft->want, ft->bytes, ft->scales, ft->want_scales,
                 ft->ns);
    CHECK_MSG(memcmp(&ft->scales[ft->ns], poison, sizeof(float)) == 0, "receiver %d version %llu "
              "target %s: a scale (%a) written past its %zu", r, (unsigned long long)v, ft->name,
              (double)ft->scales[ft->ns], ft->ns);
}

int fg_receiver_close(wsync_receiver_t *rv, wsync_ctx_t *ctx, fg_target_t *ft, int nt,
                      uint64_t *version)
{
    if (version != NULL)
        *version = wsync_receiver_version(rv);
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (int i = 0; i < nt; i++) {
        free(ft[i].buf);
        free(ft[i].want);
        free(ft[i].scales);
        free(ft[i].want_scales);
    }
    return check_failures ? 1 : 0;
}

int fg_wait_count(const int *count, int want, int timeout_ms)
{
    long long until = proc_now_ms() + timeout_ms;

    while (__atomic_load_n(count, __ATOMIC_ACQUIRE) < want) {
        if (proc_now_ms() >= until)
            return 0;
        usleep(2000);
    }
    return 1;
}
