/* wsync-bench --delta (bench_delta.c): the update generator (fp32 masters stepped by an
 * optimizer-like update, bf16 weights rounded from them), the senders' masters and the codec's
 * times on their version pairs, and the report that sets the delta group's versions beside the
 * same versions in full mode. bench_model.c runs the two groups and the receivers' checks. */
#ifndef WSYNC_BENCH_DELTA_H
#define WSYNC_BENCH_DELTA_H

#include "bench/bench.h"
#include "wsync/wsync.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the update generator ---------------------------------------------------------------- */

/* The seed of param `name`'s masters and steps. */
uint64_t bench_delta_seed(const char *name);

/* Masters of elements [src, src + n) of one param at version v, in m[0, n): version 1's values,
 * or one step of lr from version v - 1's (which m holds). */
void bench_delta_row(uint64_t seed, uint64_t src, uint64_t n, uint64_t v, float lr, float *m);

/* The weights n masters give, as esz-byte elements (2: bf16 rounded to nearest even, 4: f32
 * itself) at out. */
void bench_delta_round(const float *m, uint64_t n, size_t esz, void *out);

/* ---- per-version figures (in each group's shared page) ----------------------------------- */

typedef struct {
    /* per version index v - 1 and rank */
    atomic_int checked[MODEL_MAX_VERSIONS + 1];  /* receivers that checked version v */
    uint64_t wire[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];     /* senders' push stats */
    uint64_t encoded[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];
    uint64_t plain[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];
    uint64_t base[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];
    uint64_t changed[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];  /* elements the step changed */
    double update_s[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];   /* the step, untimed */
    /* the codec on the version's pair, apart from the sync (host: the CPU codec on every
     * version; CUDA: the kernels on the last version) */
    double enc_s[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];
    double apply_s[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];
    double copy_s[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];     /* a copy of one version */
    double amax_s[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];     /* CUDA: an amax over both */
    uint64_t codec_bytes[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];
    int codec_ok[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];      /* 0 not measured, 1 right, 2 wrong */
    char codec_wrong[MODEL_MAX_RANKS][192];                 /* the first wrong thing found */
    int wrong_versions[MODEL_MAX_RANKS];         /* versions a receiver found wrong */
    int checked_versions[MODEL_MAX_RANKS];
    char delta_line[1024];                       /* sender 0's explanation line "delta: ..." */
    /* the store on host memory: each receiver's targets read once after the run
     * (bench_delta_read_floor) */
    double read_floor_s[MODEL_MAX_RANKS];
    uint32_t read_floor_threads[MODEL_MAX_RANKS];
} bench_delta_page_t;

/* Sender 0's explanation line about delta versions ("delta: on (...)") of wsync_sender_explain's
 * text, into out ("" when there is none). */
void bench_delta_line_of(const char *explain, char *out, size_t len);

/* The store on host memory, on a receiver after its versions: the least its reader's pass over
 * these targets can take on this machine, the tree hash's reading of every byte once (XXH3 over
 * pieces of 4 MiB, handed out as the reader's pool hands out block ranges, on as many threads as
 * that pool has: WSYNC_DELTA_THREADS, or the CPUs up to its cap), best of 3, into page's entries
 * for `rank`. The pass also writes the changed lines back, so it takes more. 0, or -1 told. */
int bench_delta_read_floor(const void *block, size_t bytes, int rank, bench_delta_page_t *page);

/* ---- a sender's masters ------------------------------------------------------------------ */

typedef struct bench_delta_tx bench_delta_tx_t;

/* The masters of a sender's n shards (FSDP dim-0 boxes, as wsync_layout_fsdp_shards gives them),
 * whose weights lie in its block at offsets off[k] (bytes in all), in host memory or, with
 * o->mem_cuda, on its GPU (then stepped in a host image and copied whole). With --mem host it
 * also keeps the previous version's weights for the CPU codec's figures; with --mem cuda the
 * last version's step keeps the previous weights on the GPU (bytes more, until the codec's
 * figures are taken). Returns 0, or -1 told (out of host memory). */
int bench_delta_tx_create(const bench_opts_t *o, const wsync_shard_t *shards, size_t n,
                          const size_t *off, size_t bytes, bench_delta_tx_t **out);

/* Step the masters to version v and write the weights into block (v = 1: version 1's, which
 * with --mem host the codec's previous weights start as). Returns the elements that changed
 * (all of them for v = 1), or UINT64_MAX when the copy to the GPU failed (told). */
uint64_t bench_delta_tx_step(bench_delta_tx_t *tx, char *block, uint64_t v);

/* After bench_delta_tx_step(v > 1), before the push: the codec's figures on this version's
 * shards against the previous version's, measured apart from the sync, into page's entries of
 * version v for sender `rank`. --mem host: every version, the CPU codec (core/delta.h) as
 * core/delta_tx.c and core/delta_rx.c call it, one thread; --mem cuda: the last version only,
 * the batched kernels of kernels/delta.h timed with CUDA events (the previous weights are freed
 * after). A wrong result is recorded (codec_ok 2), not a failure. 0, or -1 told. */
int bench_delta_tx_codec(bench_delta_tx_t *tx, const char *block, int rank, uint64_t v,
                         bench_delta_page_t *page);

/* NULL is a no-op. */
void bench_delta_tx_free(bench_delta_tx_t *tx);

/* ---- the report -------------------------------------------------------------------------- */

/* The run, as the report names it. */
typedef struct {
    const bench_opts_t *o;
    const char *shape;        /* the model shape's name */
    const char *what;         /* "qwen3-0.6b FSDP-1 -> 1 replica x TP-1" */
    int N, T, R, NR;
    uint64_t param_elems, param_bytes;
    uint64_t shard_elems;     /* elements of every sender's shards */
    uint64_t plan_bytes;      /* what the plan moves per version */
} bench_delta_run_t;

/* One group's outcome. */
typedef struct {
    const bench_delta_page_t *page;
    const char *scheme, *gpu;
    double times[MODEL_MAX_VERSIONS];  /* timed versions: the slowest fetch (store) or push */
    double push[MODEL_MAX_VERSIONS];   /* timed versions: the slowest sender's push */
    int right;                         /* every receiver checked every version, all right */
    const char *first_wrong;           /* "" or the first wrong element found */
} bench_delta_group_t;

/* Prints the report (and with o->json its JSON line) of g[0], the group with delta =
 * --delta-mode, against g[1], the same versions with delta = off. Returns 0 when both were
 * right, else 1. */
int bench_delta_report(const bench_delta_run_t *run, const bench_delta_group_t *g);

#endif
