/* wsync-bench's internal header: the options, and the helpers wsync-bench.c (flat runs: ipc and
 * store over host memory) shares with bench_model.c (model-shaped runs, host or CUDA memory),
 * bench_delta.c (their --delta) and bench_cuda.c (everything that calls CUDA or NCCL, stubs in a
 * build without them). */
#ifndef WSYNC_BENCH_H
#define WSYNC_BENCH_H

#include "wsync/wsync.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PROG "wsync-bench"
#define MODEL_MAX_RANKS 64      /* senders, and receivers, of a model run */
#define MODEL_MAX_VERSIONS 64   /* warmup + iters of a model run */
#define MODEL_MAX_GPUS 16

typedef struct {
    const char *scheme;      /* "ipc", "auto", "nccl" or "store" */
    int store;               /* scheme is store */
    const char *transport;   /* store: "ucx" or "ofi" */
    int receivers;
    uint64_t bytes;          /* flat runs: total over all params */
    uint64_t bucket_bytes;
    int have_bucket;         /* --bucket-mb was given (model runs pass it to the senders) */
    int iters, warmup, params;
    int json;
    int pin;                 /* --pin (store): owners on the first allowed CPU, readers on the rest */
    int timeout_s;           /* the parent's deadline for the whole run */
    int private_mem;         /* --source private: plain malloc'd weights, staged in buckets */
    /* model runs (--model-shape) */
    const char *model_shape; /* NULL: a flat run */
    int mem_cuda;            /* --mem cuda */
    int senders, tp, replicas;
    int ep;                  /* --ep E: experts whole over the E = T ranks of a replica; 0 off */
    int fused_experts;       /* --fused-experts: senders shard transformers 5.x's fused experts */
    int colocated;
    int quant_fp8;           /* --quant fp8-block */
    int fp8_wire;            /* --fp8-wire: 1 on (default), 0 off, 2 always: the senders'
                                fp8_wire, and the plan whose bytes the floor counts */
    int delta;               /* --delta: delta versions, timed against full ones (bench_model.c) */
    double lr;               /* --lr: the update generator's learning rate (default 1e-6) */
    const char *delta_mode;  /* --delta-mode: "on" (default) or "auto", the delta run's param */
} bench_opts_t;

/* ---------------------------------------------------------------------------------------- */
/* Helpers of wsync-bench.c                                                                   */
/* ---------------------------------------------------------------------------------------- */

double bench_now_s(void);
/* Prints "wsync-bench: WHO: CALL failed: NAME (last error)"; returns 1. */
int bench_wsync_failed(const char *who, const char *call, wsync_status_t st);
/* Push version v, its seconds into *dt; 0, or 1 with the failure printed as bench_wsync_failed
 * does ("wsync_sender_push(version V) failed"). */
int bench_push(const char *who, wsync_sender_t *sender, int v, double *dt);
/* Sleep (futex) until *word >= target; count_up adds one and wakes every waiter. */
void bench_wait_at_least(atomic_int *word, int target);
void bench_count_up(atomic_int *word);
void bench_wake_all(atomic_int *word);
/* Maps `len` zeroed bytes every child shares; NULL on failure (reported). */
void *bench_map_shared(size_t len);
/* "127.0.0.1:PORT" on a free port; 0 on success. */
int bench_make_coordinator(char *buf, size_t len);
/* Median GB/s of single-threaded memcpy of `bytes`; 0 on allocation failure. */
double bench_memcpy_gbps(size_t bytes);

typedef struct {
    pid_t pid;
    char name[32];
    int done;       /* reaped */
    int status;     /* from waitpid */
} bench_child_t;

/* What child i of a group runs; res_fd is the write end of the group's result pipe. Returns the
 * child's exit status. */
typedef int (*bench_body_fn)(int i, int res_fd, void *arg);

/* Forks kids[0..n) (their names already set), each running body(i, ...) and exiting with its
 * result, then watches them: collects what they write to the result pipe into *text, reaps them,
 * and enforces the deadline (bench_now_s() clock). Returns 0 once all exited 0 and the pipe is at
 * its end; otherwise names the failures, kills the rest and returns 1. */
int bench_run_group(bench_child_t *kids, int n, bench_body_fn body, void *arg, double deadline,
                    int timeout_s, char **text);

typedef struct {
    double median, min, max;
} bench_stats_t;

/* Median, minimum and maximum of n > 0 values (the array is left as it was). */
bench_stats_t bench_stats_of(const double *v, int n);

/* A new JSON array of v[0, n) as reals, for the reports' lists of times. */
json_t *bench_json_reals(const double *v, int n);
/* Prints j as one compact line (reals to 6 digits) on stdout and frees it. */
void bench_print_json(json_t *j);

/* splitmix64's finalizer: the counter hash both data generators (bench_model.c's bf16 values,
 * bench_delta.c's masters and steps) draw from. */
static inline uint64_t bench_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------------------------------- */
/* Model runs (bench_model.c)                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Names of the built-in shapes, for --help: "tiny, qwen3-0.6b, ...". */
const char *bench_model_shape_names(void);
/* 1 when `name` is a built-in shape. */
int bench_model_shape_known(const char *name);
/* 1 when built-in shape `name` has routed experts; "tiny-moe, ..." for messages. */
int bench_model_shape_is_moe(const char *name);
const char *bench_model_moe_shape_names(void);
/* The whole model run; returns the process exit status (0 ok, 1 failed or wrong). */
int bench_model_main(const bench_opts_t *o);

typedef void (*bench_range_fn)(void *ctx, uint64_t lo, uint64_t hi);
/* fn over [0, n) split over this process's generator threads (fewer when n / grain is small),
 * as the model run sets them for its children. */
void bench_par_for(uint64_t n, uint64_t grain, bench_range_fn fn, void *ctx);

/* Bytes of one element of a param: bf16 weights, and f32 where a family keeps one (DeepSeek's
 * e_score_correction_bias). */
size_t bench_param_esz(const wsync_param_t *p);
/* Elements of box b of param p (1 for a scalar). */
uint64_t bench_box_elems(const wsync_param_t *p, const wsync_box_t *b);
/* Elements of one dim-0 row of p: a dim-0 box from row r starts at element r * this. */
uint64_t bench_row_elems(const wsync_param_t *p);

#endif
