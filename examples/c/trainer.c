/* Example trainer: sender rank `rank` of `senders`, holding FSDP shards (dim-0 rows) of every
 * param of a model, pushing versions 1..K to `receivers` inference workers.
 *
 *   trainer --coordinator HOST:PORT --rank I --senders N --receivers R [--versions K]
 *           [--config config.json] [--address-file PATH] [--skew S]
 *
 * Rank 0 hosts the coordinator on HOST:PORT (port 0: a free one; --address-file writes the one
 * it got, for the other processes to read). Without --config the model is a small built-in
 * Qwen3 shape (example_weights.h). A training step is simulated by rewriting every shard with
 * the deterministic weights of the next version (example_weights.h), so that the worker can
 * check what it receives (--skew S writes version v + S's weights under the name v: a worker
 * must then report them wrong; the examples' test uses it). Exit status 0 once every receiver
 * committed version K. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <wsync/wsync.h>
#include <wsync/wsync_layout.h>

#include "example_weights.h"

/* Prints what failed, with the library's own explanation, and says the call failed. */
static int failed(const char *what, wsync_status_t st)
{
    fprintf(stderr, "trainer: %s: %s: %s\n", what, wsync_status_name(st), wsync_last_error());
    return 1;
}

/* The "training step": write version v's weights into every element this rank holds. */
static void fill_shards(const wsync_shard_t *shards, size_t n, void *const *data, uint64_t v)
{
    for (size_t s = 0; s < n; s++) {
        const wsync_shard_t *sh = &shards[s];
        int nd = sh->param.ndim;
        int64_t count = 1;
        for (int d = 0; d < nd; d++)
            count *= sh->box.len[d];
        if (count == 0)
            continue;   /* an empty shard: the last ranks of a short param hold no rows */
        uint64_t nh = example_name_hash(sh->param.name);
        uint16_t *out = data[s];
        int64_t i[WSYNC_MAX_DIMS] = {0}, at[WSYNC_MAX_DIMS];
        do {   /* the box's points in row-major order, which is how the shard is stored */
            for (int d = 0; d < nd; d++)
                at[d] = sh->box.start[d] + i[d];
            *out++ = example_value(nh, (uint64_t)example_offset(at, sh->param.shape, nd), v);
        } while (example_next(i, sh->box.len, nd));
    }
}

int main(int argc, char **argv)
{
    const char *coordinator = "127.0.0.1:29600", *config = NULL, *address_file = NULL;
    int rank = 0, senders = 1, receivers = 1;
    uint64_t versions = 3, skew = 0;
    for (int a = 1; a + 1 < argc; a += 2) {
        const char *k = argv[a], *v = argv[a + 1];
        if (!strcmp(k, "--coordinator")) coordinator = v;
        else if (!strcmp(k, "--rank")) rank = atoi(v);
        else if (!strcmp(k, "--senders")) senders = atoi(v);
        else if (!strcmp(k, "--receivers")) receivers = atoi(v);
        else if (!strcmp(k, "--versions")) versions = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--config")) config = v;
        else if (!strcmp(k, "--address-file")) address_file = v;
        else if (!strcmp(k, "--skew")) skew = strtoull(v, NULL, 10);
        else { fprintf(stderr, "trainer: unknown option %s\n", k); return 2; }
    }
    if (argc % 2 == 0) { fprintf(stderr, "trainer: option %s has no value\n", argv[argc - 1]); return 2; }

    /* 1. The model: its config gives every param's name and shape. */
    wsync_model_config_t cfg;
    wsync_status_t st;
    if ((st = example_config(config, &cfg)) != WSYNC_OK)
        return failed("wsync_model_config_load", st);

    /* 2. This rank's FSDP shards: one per param, rows [rank*c, (rank+1)*c) of each. */
    wsync_shard_t *shards = NULL;
    size_t nshards = 0;
    if ((st = wsync_layout_fsdp_shards(&cfg, WSYNC_DTYPE_BF16, rank, senders, &shards, &nshards)))
        return failed("wsync_layout_fsdp_shards", st);

    /* 3. A context and the sender. Rank 0 starts the coordinator here. */
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *sender = NULL;
    void *arena = NULL, **data = calloc(nshards, sizeof *data);
    int rc = 1;
    if (!data) { fprintf(stderr, "trainer: out of memory\n"); goto out; }
    if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) { failed("wsync_ctx_create", st); goto out; }
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    sp.coordinator = coordinator;
    sp.rank = rank;
    sp.nranks = senders;
    sp.nreceivers = receivers;
    if ((st = wsync_sender_create(ctx, &sp, &sender)) != WSYNC_OK) {
        failed("wsync_sender_create", st);
        goto out;
    }
    if (rank == 0) {
        printf("trainer 0: coordinator on %s\n", wsync_sender_coordinator(sender));
        fflush(stdout);
        if (address_file) {   /* written whole, then renamed: a reader never sees half of it */
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s.tmp", address_file);
            FILE *f = fopen(tmp, "w");
            if (!f || fprintf(f, "%s\n", wsync_sender_coordinator(sender)) < 0 || fclose(f) != 0 ||
                rename(tmp, address_file) != 0) {
                perror(address_file);
                goto out;
            }
        }
    }

    /* 4. The shards' memory. wsync_mem_alloc memory is shared once with receivers on this node,
     * which then read it in place; any memory works (it is staged otherwise). One block for
     * all, each shard 64-byte aligned. */
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {   /* 1st: the size; 2nd: each shard's place in it */
        size_t at = 0;
        for (size_t s = 0; s < nshards; s++) {
            size_t bytes = wsync_dtype_size(shards[s].param.dtype);
            for (int d = 0; d < shards[s].param.ndim; d++)
                bytes *= (size_t)shards[s].box.len[d];
            if (pass == 1)
                data[s] = (char *)arena + at;
            at += (bytes + 63) / 64 * 64;
        }
        total = at;
        if (pass == 0 && (st = wsync_mem_alloc(ctx, total ? total : 64, &arena)) != WSYNC_OK) {
            failed("wsync_mem_alloc", st);
            goto out;
        }
    }
    for (size_t s = 0; s < nshards; s++) {
        shards[s].data = data[s];
        shards[s].mem = WSYNC_MEM_HOST;
        if ((st = wsync_sender_add_shard(sender, &shards[s])) != WSYNC_OK) {
            fprintf(stderr, "trainer %d: param %s:\n", rank, shards[s].param.name);
            failed("wsync_sender_add_shard", st);
            goto out;
        }
    }

    /* 5. Train and push. push(v) returns once every receiver committed v: only then may the
     * shards change again (the next step). */
    for (uint64_t v = 1; v <= versions; v++) {
        fill_shards(shards, nshards, data, v + skew);
        if ((st = wsync_sender_push(sender, v)) != WSYNC_OK) {
            fprintf(stderr, "trainer %d: version %llu:\n", rank, (unsigned long long)v);
            failed("wsync_sender_push", st);
            goto out;
        }
        printf("trainer %d: pushed version %llu (%zu shards, scheme %s)\n", rank,
               (unsigned long long)v, nshards, wsync_sender_scheme(sender));
        fflush(stdout);
    }
    rc = 0;

out:   /* the sender first: its receivers may still read the shard memory until it leaves */
    wsync_sender_free(sender);
    if (arena)
        wsync_mem_free(ctx, arena);
    wsync_ctx_free(ctx);
    wsync_layout_shards_free(shards, nshards);
    free(data);
    return rc;
}
