/* fp8_groups: see fp8_groups.h. */
#include "tests/support/fp8_groups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tests/support/check.h"

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

void fg_fsdp_rows(int64_t rows, int s, int n, int64_t *lo, int64_t *hi)
{
    *lo = rows * s / n;
    *hi = rows * (s + 1) / n;
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

uint16_t *fg_add_rows(wsync_sender_t *snd, wsync_param_t param, int64_t lo, int64_t hi)
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

void fg_check_target(int r, uint64_t v, const char *name, const uint8_t *have,
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
