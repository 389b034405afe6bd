/* Delta versions' state (core/delta_state.h), without processes: the group's mode as the
 * coordinator resolves it from HELLOs (off wins, then on, then auto by scheme and hosts; a scheme
 * without delta refuses on, naming it), and a sender's baselines on a hand-made plan: chunks that
 * overlap another chunk of their shard are not delta-capable, the base version follows whole
 * pushes only, encoding brings the baseline to the new values and its stream applies onto the
 * old values to give them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/delta.h"
#include "core/delta_state.h"
#include "core/status.h"
#include "tests/support/check.h"
#include "wsync/wsync.h"

typedef struct {
    wsync_hello_t h[8];
    wsync_group_info_t g;
} group_t;

static void group_make(group_t *gr, uint32_t ns, uint32_t nr, const uint32_t *delta,
                       const char *const *hosts)
{
    memset(gr, 0, sizeof(*gr));
    for (uint32_t i = 0; i < ns + nr; i++) {
        gr->h[i].role = i < ns ? WSYNC_ROLE_SENDER : WSYNC_ROLE_RECEIVER;
        gr->h[i].rank = (int32_t)(i < ns ? i : i - ns);
        gr->h[i].delta = delta[i];
        gr->h[i].host_id = (char *)hosts[i];
    }
    gr->g.nsenders = ns;
    gr->g.nreceivers = nr;
    gr->g.senders = gr->h;
    gr->g.receivers = gr->h + ns;
}

static void case_resolve(void)
{
    const wsync_scheme_ops_t ipc = {.name = "ipc", .delta = 1};
    const wsync_scheme_ops_t nccl_plain = {.name = "nccl", .delta = 0};
    const wsync_scheme_ops_t nccl = {.name = "nccl", .delta = 1};
    const char *one[] = {"a/n1", "a/n1", "a/n1"}, *two[] = {"a/n1", "b/n1", "b/n1"};
    const uint32_t A = WSYNC_DELTA_MODE_AUTO, ON = WSYNC_DELTA_MODE_ON, OFF = WSYNC_DELTA_MODE_OFF;
    char line[1024];
    uint32_t mode = 99;
    group_t gr;

    /* any off wins, even over on */
    group_make(&gr, 1, 2, (const uint32_t[]){ON, A, OFF}, one);
    CHECK_OK(wsync_delta_resolve(&gr.g, &ipc, 0, &mode, line, sizeof(line)));
    CHECK(mode == OFF);
    CHECK_MSG(strcmp(line, "delta: off (receiver 1 asked for delta = off)\n") == 0, "%s", line);
    /* on, where the scheme carries it; the FP8 note */
    group_make(&gr, 1, 2, (const uint32_t[]){A, ON, A}, one);
    CHECK_OK(wsync_delta_resolve(&gr.g, &ipc, 1, &mode, line, sizeof(line)));
    CHECK(mode == ON);
    CHECK_MSG(strstr(line, "delta: on (receiver 0 asked for delta = on); quantized FP8 targets "
                           "take every version in full") == line, "%s", line);
    /* the cut-off and its defaults (docs/delta.md "When a chunk goes plain") */
    char cut[128];
    snprintf(cut, sizeof(cut), "delta_cutoff x its plain bytes (default %g for host shards",
             WSYNC_DELTA_CUTOFF_HOST);
    CHECK_MSG(strstr(line, cut) != NULL && line[strlen(line) - 1] == '\n', "%s", line);
    /* on, where it does not: refused, naming the scheme and who asked; outputs untouched */
    mode = 99;
    CHECK_ST(wsync_delta_resolve(&gr.g, &nccl_plain, 0, &mode, line, sizeof(line)),
             WSYNC_ERR_UNSUPPORTED);
    CHECK_ERR_HAS("delta versions are not yet carried by the nccl scheme (receiver 0 asked");
    CHECK(mode == 99);
    /* auto: off on one host whatever the scheme, and for ipc; on for nccl across hosts only
     * where nccl carries it */
    group_make(&gr, 1, 2, (const uint32_t[]){A, A, A}, one);
    CHECK_OK(wsync_delta_resolve(&gr.g, &nccl, 0, &mode, line, sizeof(line)));
    CHECK_MSG(mode == OFF && strstr(line, "share one host and network namespace"), "%s", line);
    group_make(&gr, 1, 2, (const uint32_t[]){A, A, A}, two);
    CHECK_OK(wsync_delta_resolve(&gr.g, &ipc, 0, &mode, line, sizeof(line)));
    CHECK_MSG(mode == OFF && strstr(line, "auto: the ipc scheme"), "%s", line);
    CHECK_OK(wsync_delta_resolve(&gr.g, &nccl_plain, 0, &mode, line, sizeof(line)));
    CHECK_MSG(mode == OFF && strstr(line, "does not carry delta versions yet"), "%s", line);
    CHECK_OK(wsync_delta_resolve(&gr.g, &nccl, 0, &mode, line, sizeof(line)));
    CHECK_MSG(mode == ON && strstr(line, "delta: on (auto: the nccl scheme spans 2 hosts"), "%s",
              line);
    /* a store set up before its readers: they come later, from anywhere */
    const wsync_scheme_ops_t store = {.name = "store", .async = 1, .delta = 1};
    group_make(&gr, 2, 0, (const uint32_t[]){A, A}, one);
    CHECK_OK(wsync_delta_resolve(&gr.g, &store, 0, &mode, line, sizeof(line)));
    CHECK_MSG(mode == ON && strstr(line, "readers come later"), "%s", line);
}

/* One host shard [8, 64] bf16 of sender 0, and chunks over it: rows 0-1 and 2-3 (apart), rows
 * 4-5 and rows 5-6 cols 0-31 (overlapping), rows 6-7 cols 32-63 (beside the last: apart). */
static void case_baselines(void)
{
    wsync_chunk_t chunks[5] = {
        {0, 0, WSYNC_DTYPE_BF16, 0, {0 * 64, 64, 2, 64}, 0, 0, 0},
        {0, 0, WSYNC_DTYPE_BF16, 0, {2 * 64, 64, 2, 64}, 0, 0, 256},
        {0, 0, WSYNC_DTYPE_BF16, 0, {4 * 64, 64, 2, 64}, 0, 0, 512},
        {0, 0, WSYNC_DTYPE_BF16, 0, {5 * 64, 64, 2, 32}, 0, 0, 768},
        {0, 0, WSYNC_DTYPE_BF16, 0, {6 * 64 + 32, 64, 2, 32}, 0, 0, 896},
    };
    wsync_plan_t plan;
    wsync_shard_desc_t desc;
    uint16_t data[8 * 64], old[8 * 64];
    const void *shard_data[1] = {data};
    wsync_sender_t *s = calloc(1, sizeof(*s));
    wsync_delta_tx_t *tx = NULL;

    memset(&plan, 0, sizeof(plan));
    plan.nsenders = 1;
    plan.nchunks = 5;
    plan.chunks = chunks;
    memset(&desc, 0, sizeof(desc));
    desc.param.dtype = WSYNC_DTYPE_BF16;
    desc.param.ndim = 2;
    desc.param.shape[0] = 8;
    desc.param.shape[1] = 64;
    desc.box.len[0] = 8;
    desc.box.len[1] = 64;
    desc.mem = WSYNC_MEM_HOST;
    s->m.plan = &plan;
    s->m.rank = 0;
    s->shards = &desc;
    s->shard_data = shard_data;
    s->nshards = 1;
    s->device = -1;
    for (int i = 0; i < 8 * 64; i++)
        data[i] = (uint16_t)(0x3c00 + i);
    CHECK_OK(wsync_delta_tx_create(s, &tx));
    if (tx == NULL)
        return;
    CHECK(wsync_delta_tx_capable(tx, 0) && wsync_delta_tx_capable(tx, 1));
    CHECK(!wsync_delta_tx_capable(tx, 2) && !wsync_delta_tx_capable(tx, 3));
    CHECK(wsync_delta_tx_capable(tx, 4));
    CHECK(wsync_delta_tx_ncapable(tx) == 3 && wsync_delta_tx_bytes(tx) == sizeof(data));

    /* version 1: no base; every capable chunk refreshed -> version 2 is against 1 */
    uint8_t out[256];
    uint64_t len = 99, hash = 0;
    CHECK(wsync_delta_tx_begin(tx, 1) == 0);
    CHECK_OK(wsync_delta_tx_encode(tx, 0, out, sizeof(out), &len, &hash));
    CHECK(len == 0 && hash == 0);   /* plain: no hash (no receiver reads it) */
    CHECK_OK(wsync_delta_tx_refresh(tx, 1, NULL));
    CHECK_OK(wsync_delta_tx_refresh(tx, 4, NULL));
    wsync_delta_tx_end(tx, 1, 1);

    /* version 2: one element of chunk 0 changes: a small stream that turns the old values into
     * the new ones, the baseline updated; chunk 4 left out -> no base for version 3 */
    memcpy(old, data, sizeof(old));
    data[64 + 5] ^= 1;
    CHECK(wsync_delta_tx_begin(tx, 2) == 1);
    CHECK_OK(wsync_delta_tx_encode(tx, 0, out, sizeof(out), &len, &hash));
    CHECK_MSG(len > 0 && len < 2 * 64 * 2, "encoded %llu bytes", (unsigned long long)len);
    CHECK(hash == wsync_delta_hash(data, &chunks[0].src, 2));
    CHECK_OK(wsync_delta_check(out, len, 2 * 64, 2, "chunk 0"));
    uint64_t got = 0;
    CHECK_OK(wsync_delta_apply(out, len, old, &chunks[0].src, 2, &got));
    CHECK(got == hash && memcmp(old, data, sizeof(data)) == 0);
    /* encoding again against the updated baseline finds nothing changed */
    CHECK_OK(wsync_delta_tx_encode(tx, 0, out, sizeof(out), &len, &hash));
    CHECK(len > 0 && len <= WSYNC_DELTA_HEADER + 8);
    CHECK_OK(wsync_delta_tx_refresh(tx, 1, NULL));
    wsync_delta_tx_end(tx, 2, 1);
    CHECK(wsync_delta_tx_begin(tx, 3) == 0);
    CHECK_OK(wsync_delta_tx_refresh(tx, 0, NULL));
    CHECK_OK(wsync_delta_tx_refresh(tx, 1, NULL));
    CHECK_OK(wsync_delta_tx_refresh(tx, 4, NULL));
    wsync_delta_tx_end(tx, 3, 1);
    /* a failed push: no base */
    CHECK(wsync_delta_tx_begin(tx, 4) == 3);
    wsync_delta_tx_end(tx, 4, 0);
    CHECK(wsync_delta_tx_begin(tx, 5) == 0);
    /* not a capable chunk: refused, named */
    CHECK_ST(wsync_delta_tx_encode(tx, 2, out, sizeof(out), &len, &hash), WSYNC_ERR_INTERNAL);
    CHECK_ERR_HAS("chunk 2 is not a delta-capable chunk");
    wsync_delta_tx_free(tx);
    free(s);
}

int main(void)
{
    RUN(case_resolve);
    RUN(case_baselines);
    return check_summary();
}
