/* Example inference worker: receiver rank `rank` of `receivers`, laid out as TP rank
 * rank % tp of a vLLM engine of tensor-parallel size `tp` (fused qkv_proj and gate_up_proj,
 * vocab-parallel embeddings, replicated norms: wsync_layout_tp_targets). It waits for versions
 * until version K, and after each one checks every element it received against the weights the
 * example trainer writes (example_weights.h) and prints a checksum of its buffers.
 *
 *   worker --coordinator HOST:PORT --rank R --receivers N [--tp T] [--versions K]
 *          [--config config.json]
 *
 * Exit status 0 when version K arrived and every element was right; 1 otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <wsync/wsync.h>
#include <wsync/wsync_layout.h>

#include "example_weights.h"

static int failed(const char *what, wsync_status_t st)
{
    fprintf(stderr, "worker: %s: %s: %s\n", what, wsync_status_name(st), wsync_last_error());
    return 1;
}

/* Number of elements of target t that differ from version v's weights; the first is printed. */
static long check_target(const wsync_target_t *t, uint64_t v, int rank)
{
    const uint16_t *buf = t->data;
    long bad = 0;
    for (int p = 0; p < t->npieces; p++) {
        const wsync_piece_t *pc = &t->pieces[p];
        int nd = t->ndim;
        int64_t count = 1;
        for (int d = 0; d < nd; d++)
            count *= pc->src.len[d];
        if (count == 0)
            continue;
        uint64_t nh = example_name_hash(pc->param.name);
        /* the piece's box of the param lands at dst_start of the target, point for point */
        int64_t i[WSYNC_MAX_DIMS] = {0}, src[WSYNC_MAX_DIMS], dst[WSYNC_MAX_DIMS];
        do {
            for (int d = 0; d < nd; d++) {
                src[d] = pc->src.start[d] + i[d];
                dst[d] = pc->dst_start[d] + i[d];
            }
            uint16_t want = example_value(nh, (uint64_t)example_offset(src, pc->param.shape, nd), v);
            uint16_t got = buf[example_offset(dst, t->shape, nd)];
            if (got != want && bad++ == 0)
                fprintf(stderr, "worker %d: version %llu: %s element %lld (of param %s) is 0x%04x, "
                        "expected 0x%04x\n", rank, (unsigned long long)v, t->name,
                        (long long)example_offset(dst, t->shape, nd), pc->param.name, got, want);
        } while (example_next(i, pc->src.len, nd));
    }
    return bad;
}

int main(int argc, char **argv)
{
    const char *coordinator = "127.0.0.1:29600", *config = NULL;
    int rank = 0, receivers = 1, tp = 1;
    uint64_t versions = 3;
    for (int a = 1; a + 1 < argc; a += 2) {
        const char *k = argv[a], *v = argv[a + 1];
        if (!strcmp(k, "--coordinator")) coordinator = v;
        else if (!strcmp(k, "--rank")) rank = atoi(v);
        else if (!strcmp(k, "--receivers")) receivers = atoi(v);
        else if (!strcmp(k, "--tp")) tp = atoi(v);
        else if (!strcmp(k, "--versions")) versions = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--config")) config = v;
        else { fprintf(stderr, "worker: unknown option %s\n", k); return 2; }
    }
    if (argc % 2 == 0) { fprintf(stderr, "worker: option %s has no value\n", argv[argc - 1]); return 2; }
    if (tp < 1) { fprintf(stderr, "worker: --tp must be >= 1, not %d\n", tp); return 2; }

    wsync_model_config_t cfg;
    wsync_status_t st;
    if ((st = example_config(config, &cfg)) != WSYNC_OK)
        return failed("wsync_model_config_load", st);

    /* 1. The engine's buffers as vLLM lays them out for TP rank rank % tp (options NULL: bf16,
     * no quantization, vocab padded to 64). A real engine points the targets at its own
     * parameters; here each gets zeroed host memory. */
    wsync_target_t *targets = NULL;
    size_t ntargets = 0;
    if ((st = wsync_layout_tp_targets(&cfg, rank % tp, tp, NULL, &targets, &ntargets)))
        return failed("wsync_layout_tp_targets", st);

    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    int rc = 1;
    for (size_t t = 0; t < ntargets; t++) {
        size_t bytes = wsync_dtype_size(targets[t].dtype);
        for (int d = 0; d < targets[t].ndim; d++)
            bytes *= (size_t)targets[t].shape[d];
        if (targets[t].dtype != WSYNC_DTYPE_BF16) {
            fprintf(stderr, "worker: target %s is %s; this example checks bf16 only\n",
                    targets[t].name, wsync_dtype_name(targets[t].dtype));
            goto out;
        }
        if (!(targets[t].data = calloc(1, bytes ? bytes : 1))) {
            fprintf(stderr, "worker: out of memory for target %s (%zu bytes)\n", targets[t].name, bytes);
            goto out;
        }
        targets[t].mem = WSYNC_MEM_HOST;
    }

    /* 2. The receiver. It connects to the coordinator (retrying until its deadline), so it may
     * start before or after the trainer. */
    if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) { failed("wsync_ctx_create", st); goto out; }
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    rp.coordinator = coordinator;
    rp.rank = rank;
    rp.nreceivers = receivers;
    if ((st = wsync_receiver_create(ctx, &rp, &rv)) != WSYNC_OK) {
        failed("wsync_receiver_create", st);
        goto out;
    }
    for (size_t t = 0; t < ntargets; t++) {
        if ((st = wsync_receiver_add_target(rv, &targets[t])) != WSYNC_OK) {
            fprintf(stderr, "worker %d: target %s:\n", rank, targets[t].name);
            failed("wsync_receiver_add_target", st);
            goto out;
        }
    }

    /* 3. Serve. wait() returns with a whole version in the buffers, never a mix of two. An engine
     * that must recompute something from its weights before serving them does it in the
     * receiver's on_version hook (wsync_receiver_params_t), which runs before the commit. */
    uint64_t version = 0;
    while (version < versions) {
        if ((st = wsync_receiver_wait(rv, -1, &version)) != WSYNC_OK) {
            failed("wsync_receiver_wait", st);
            goto out;
        }
        long bad = 0;
        uint64_t sum = 0xcbf29ce484222325ull;   /* FNV-1a over every buffer, in target order */
        for (size_t t = 0; t < ntargets; t++) {
            bad += check_target(&targets[t], version, rank);
            size_t bytes = wsync_dtype_size(targets[t].dtype);
            for (int d = 0; d < targets[t].ndim; d++)
                bytes *= (size_t)targets[t].shape[d];
            for (size_t b = 0; b < bytes; b++)
                sum = (sum ^ ((const unsigned char *)targets[t].data)[b]) * 0x100000001b3ull;
        }
        printf("worker %d (tp %d/%d): version %llu, %zu targets, checksum %016llx, %s\n", rank,
               rank % tp, tp, (unsigned long long)version, ntargets, (unsigned long long)sum,
               bad ? "WRONG" : "every element right");
        fflush(stdout);
        if (bad) {
            fprintf(stderr, "worker %d: version %llu: %ld elements differ\n", rank,
                    (unsigned long long)version, bad);
            goto out;
        }
    }
    rc = 0;

out:
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (size_t t = 0; t < ntargets; t++)
        free(targets[t].data);
    wsync_layout_targets_free(targets, ntargets);
    return rc;
}
