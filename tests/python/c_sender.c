/* A C trainer rank for the Python tests: FSDP rank --rank of --senders of HF Qwen3-tiny
 * (dim-0 shards from wsync_layout_fsdp_shards, in its own copy of the checkpoint's bytes),
 * pushing versions 1..--versions to --receivers receivers over ipc.
 *
 * Rank 0 hosts the coordinator at --coordinator (port 0: a free one) and prints
 * "coordinator HOST:PORT" on stdout once it listens. With --expect-error TEXT the group must
 * fail at setup (or the first push) with WSYNC_ERR_MISMATCH and a message containing TEXT.
 * Exit status 0 when everything went as expected. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/python/c_peer.h"
#include "tests/support/check.h"
#include "tests/support/safetensors_min.h"
#include "wsync/wsync.h"

static int run(const peer_opts_t *o)
{
    char err[512];
    st_file_t *f = NULL;
    wsync_model_config_t cfg;
    wsync_shard_t *shards = NULL;
    size_t nshards = 0;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint8_t *copy = NULL;
    wsync_status_t st;

    if (st_open(PEER_CKPT, &f, err, sizeof(err)) != 0) {
        CHECK_MSG(0, "%s", err);
        return 1;
    }
    CHECK_OK(wsync_model_config_load(PEER_CONFIG, &cfg));
    CHECK_OK(wsync_layout_fsdp_shards(&cfg, WSYNC_DTYPE_BF16, o->rank, o->senders, &shards,
                                      &nshards));
    CHECK_MSG(nshards == st_count(f), "%zu shards for %zu tensors", nshards, st_count(f));
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    if (check_failures)
        goto out;
    sp.coordinator = o->coordinator;
    sp.rank = o->rank;
    sp.nranks = o->senders;
    sp.nreceivers = o->receivers;
    sp.scheme = "ipc";
    sp.timeout_ms = o->timeout_ms;
    sp.heartbeat_ms = 200;
    st = wsync_sender_create(ctx, &sp, &s);
    if (st != WSYNC_OK && o->expect_error != NULL) {
        /* the group may have failed before this sender joined; it must still say why */
        CHECK_ERR_HAS(o->expect_error);
        fprintf(stderr, "c_sender %d: create: %s\n", o->rank, wsync_last_error());
        goto out;
    }
    CHECK_OK(st);
    if (st != WSYNC_OK)
        goto out;
    if (o->rank == 0) {
        printf("coordinator %s\n", wsync_sender_coordinator(s));
        fflush(stdout);
    }

    copy = malloc(st_data_size(f));
    if (copy == NULL)
        goto out;
    memcpy(copy, st_data(f), st_data_size(f));
    for (size_t i = 0; i < nshards; i++) {
        const st_tensor_t *t = st_find(f, shards[i].param.name);
        int64_t row_elems = 1;
        CHECK_MSG(t != NULL, "checkpoint has no '%s'", shards[i].param.name);
        if (t == NULL)
            goto out;
        for (int d = 1; d < t->ndim; d++)
            row_elems *= t->shape[d];
        shards[i].data = copy + t->offset + (size_t)(shards[i].box.start[0] * row_elems) * 2;
        CHECK_OK(wsync_sender_add_shard(s, &shards[i]));
    }
    if (check_failures)
        goto out;

    st = wsync_sender_setup(s);
    if (o->expect_error != NULL) {
        if (st == WSYNC_OK)
            st = wsync_sender_push(s, 1);
        CHECK_MSG(st == WSYNC_ERR_MISMATCH, "c_sender %d: setup/push returned %s (%s), expected "
                  "WSYNC_ERR_MISMATCH naming %s", o->rank, wsync_status_name(st),
                  wsync_last_error(), o->expect_error);
        CHECK_ERR_HAS(o->expect_error);
        fprintf(stderr, "c_sender %d saw: %s: %s\n", o->rank, wsync_status_name(st),
                wsync_last_error());
        goto out;
    }
    CHECK_OK(st);
    if (st != WSYNC_OK)
        goto out;
    for (int v = 1; v <= o->versions; v++) {
        for (size_t i = 0; i < nshards; i++) {
            const st_tensor_t *t = st_find(f, shards[i].param.name);
            int64_t row_elems = 1;
            for (int d = 1; d < t->ndim; d++)
                row_elems *= t->shape[d];
            int64_t e0 = shards[i].box.start[0] * row_elems;
            int64_t e1 = e0 + shards[i].box.len[0] * row_elems;
            for (int64_t e = e0; e < e1; e++) {
                uint16_t w = peer_version_value(peer_load_u16(t->data + 2 * e), v);
                memcpy(copy + t->offset + 2 * e, &w, 2);
            }
        }
        st = wsync_sender_push(s, (uint64_t)v);
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
    }
    if (check_failures == 0)
        fprintf(stderr, "c_sender %d: pushed %d versions over %s\n", o->rank, o->versions,
                wsync_sender_scheme(s));

out:
    wsync_sender_free(s);
    free(copy);
    wsync_ctx_free(ctx);
    wsync_layout_shards_free(shards, nshards);
    st_close(f);
    return check_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    peer_opts_t o;

    signal(SIGPIPE, SIG_IGN);
    if (peer_parse(argc, argv, &o) != 0)
        return 2;
    return run(&o);
}
