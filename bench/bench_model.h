/* Internal to wsync-bench: what the model runs (bench_model.c) share with their report
 * (bench_model_report.c): the shape, the run's layouts and results page, and the plan the group
 * moved. */
#ifndef WSYNC_BENCH_MODEL_H
#define WSYNC_BENCH_MODEL_H

#include <stdatomic.h>
#include <stdint.h>

#include "bench/bench.h"
#include "bench/bench_cuda.h"
#include "bench/bench_delta.h"
#include "wsync/wsync_layout.h"
#include "wsync/wsync.h"
#include "wsync/wsync_plan.h"

typedef struct {
    const char *name;
    wsync_model_type_t type;
    int64_t hidden, layers, heads, kv_heads, head_dim, inter, vocab;
    int tie, qk_norm;
    double theta;
    /* mixture of experts (0 experts: dense) */
    int64_t experts, topk, moe_inter;
    /* deepseek: shared experts, leading dense layers, MLA ranks and head dims */
    int64_t shared, first_dense, q_lora, kv_lora, nope, rope, v_head;
} model_shape_t;

typedef struct {
    atomic_int arrived[MODEL_MAX_VERSIONS + 1];  /* senders at the start of version v */
    atomic_int pushed[MODEL_MAX_VERSIONS + 1];   /* senders whose push of v returned */
    atomic_int fetched[MODEL_MAX_VERSIONS + 1];  /* store: receivers that fetched v */
    atomic_int receivers_done;                   /* store: receivers that left */
    int ngpu;
    char gpu_name[96];
    bench_probe_req_t probe_req;
    bench_probe_res_t probe;
    char scheme[32];
    int wire_off;                                /* its explanation: FP8 on the wire is off */
    int refused;                                 /* the probe found the run cannot fit */
    double push_s[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];
    double fetch_s[MODEL_MAX_VERSIONS][MODEL_MAX_RANKS];
    int verdict[MODEL_MAX_RANKS];                /* receivers: 1 right, 2 wrong */
    uint64_t final_version[MODEL_MAX_RANKS];
    uint64_t digest[MODEL_MAX_RANKS];
    int wrong_targets[MODEL_MAX_RANKS];
    int skipped_versions[MODEL_MAX_RANKS];
    char first_wrong[MODEL_MAX_RANKS][256];
    double verify_s[MODEL_MAX_RANKS];
    double fill_s[MODEL_MAX_RANKS];
    bench_delta_page_t d;                        /* --delta (one page per mode) */
} model_shared_t;

typedef struct {
    const bench_opts_t *o;
    const model_shape_t *shape;
    wsync_model_config_t cfg;
    int N, T, R, NR;                              /* senders, tp, replicas, receivers */
    wsync_shard_t *shards[MODEL_MAX_RANKS];
    size_t nshards[MODEL_MAX_RANKS];
    wsync_target_t *targets[MODEL_MAX_RANKS];
    size_t ntargets[MODEL_MAX_RANKS];
    wsync_plan_summary_t *sum;                    /* every chunk plain (FP8 on the wire off) */
    wsync_plan_summary_t *sum_wire;               /* FP8 on the wire on: NULL when it cannot be
                                                     (off, no FP8 targets, the store, --delta) */
    uint64_t param_elems, param_count, param_bytes;
    uint64_t sender_bytes[MODEL_MAX_RANKS];       /* shards, as run_sender allocates them */
    uint64_t receiver_bytes[MODEL_MAX_RANKS];     /* targets and scales, as run_receiver does */
    int ngpu;
    int gpu_s[MODEL_MAX_RANKS], gpu_r[MODEL_MAX_RANKS];
    char coordinator[32];
    model_shared_t *sh;
    const char *delta_param;                      /* --delta: this group's delta param */
    uint64_t shard_elems;                         /* elements of every sender's shards */
} model_t;

/* The plan the group moved: FP8 on the wire where it was asked for and the scheme the group
 * chose sends it, else every chunk plain (bench_model.c). */
const wsync_plan_summary_t *bench_model_moved(const model_t *m);
/* What the run is, for messages: "qwen3-30b-a3b FSDP-2 -> 1 replica x EP-2". */
void bench_model_run_words(const model_t *m, char *buf, size_t len);

/* bench_model_report.c: the floor at the links measured in the same run, the table and the
 * JSON line; --delta's report over the two groups' pages. 0, or 1 when a receiver was wrong. */
int bench_model_report(const model_t *m, double memcpy_gbps);
int bench_model_report_delta(const model_t *m, model_shared_t *const *sh);

#endif
